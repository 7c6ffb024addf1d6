"""Kubeconfig reading (path resolution, contexts, errors) and atomic 0600 writing."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest
import yaml

from podnet.kubeconfig import (
    ClientConfig,
    KubeconfigError,
    load_client_config,
    resolve_path,
    write_kubeconfig,
)

CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def write_yaml(path: Path, doc: object) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def config_doc(**cluster: object) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "ctx",
        "clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443", **cluster}}],
        "users": [{"name": "u", "user": {"token": "tok"}}],
        "contexts": [
            {"name": "ctx", "context": {"cluster": "c", "user": "u", "namespace": "shop"}}
        ],
    }


def test_write_then_load_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "kube" / "config"
    write_kubeconfig(path, "https://127.0.0.1:6443", CA, "secret-token")
    cfg = load_client_config(str(path))
    assert cfg == ClientConfig(
        server="https://127.0.0.1:6443",
        ca_data=CA,
        token="secret-token",
        insecure_skip_tls_verify=False,
        namespace=None,
        source=path,
    )


def test_written_file_is_kubectl_format(tmp_path: Path) -> None:
    path = tmp_path / "config"
    write_kubeconfig(path, "https://127.0.0.1:6443", CA, "t0k", user="alice", cluster="lab")
    doc = yaml.safe_load(path.read_text())
    assert doc["apiVersion"] == "v1" and doc["kind"] == "Config"
    cluster = doc["clusters"][0]
    assert cluster["name"] == "lab"
    assert cluster["cluster"]["server"] == "https://127.0.0.1:6443"
    assert base64.b64decode(cluster["cluster"]["certificate-authority-data"]) == CA
    assert doc["users"] == [{"name": "alice", "user": {"token": "t0k"}}]
    context = doc["contexts"][0]
    assert context["context"] == {"cluster": "lab", "user": "alice"}
    assert doc["current-context"] == context["name"]


def test_write_is_0600_atomic_and_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text("old")
    path.chmod(0o644)
    write_kubeconfig(path, "https://h:1", CA, "t")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["config"]
    assert load_client_config(str(path)).token == "t"


def test_context_namespace_and_insecure_flag(tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "c", config_doc(**{"insecure-skip-tls-verify": True}))
    cfg = load_client_config(str(path))
    assert cfg.namespace == "shop"
    assert cfg.insecure_skip_tls_verify is True
    assert cfg.ca_data is None and cfg.token == "tok"


def test_certificate_authority_and_token_files_are_relative_to_the_kubeconfig(
    tmp_path: Path,
) -> None:
    (tmp_path / "ca.crt").write_bytes(CA)
    (tmp_path / "token").write_text("from-file\n")
    doc = config_doc(**{"certificate-authority": "ca.crt"})
    doc["users"][0]["user"] = {"tokenFile": "token"}
    cfg = load_client_config(str(write_yaml(tmp_path / "c", doc)))
    assert cfg.ca_data == CA
    assert cfg.token == "from-file"


def test_kubeconfig_env_picks_first_existing_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    second = tmp_path / "second"
    write_kubeconfig(second, "https://second:6443", CA, "t2")
    third = tmp_path / "third"
    write_kubeconfig(third, "https://third:6443", CA, "t3")
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{second}:{third}")
    assert load_client_config().server == "https://second:6443"
    # An explicit path wins over the environment.
    assert load_client_config(str(third)).server == "https://third:6443"


def test_default_path_is_home_kube_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(KubeconfigError, match=r"no kubeconfig found at .*\.kube/config"):
        load_client_config()
    write_kubeconfig(tmp_path / ".kube" / "config", "https://home:6443", CA, "t")
    assert load_client_config().server == "https://home:6443"


def test_missing_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError, match="does not exist"):
        load_client_config(str(tmp_path / "nope"))
    env = {"KUBECONFIG": f"{tmp_path / 'a'}:{tmp_path / 'b'}"}
    with pytest.raises(KubeconfigError, match=r"none of the files in \$KUBECONFIG exist"):
        resolve_path(None, env)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("clusters: [", "is not valid YAML"),
        ("- a\n- b\n", "is not a YAML mapping"),
        ("apiVersion: v1\n", "current-context is not set"),
    ],
)
def test_invalid_documents(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config"
    path.write_text(text)
    with pytest.raises(KubeconfigError, match=message) as info:
        load_client_config(str(path))
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_undefined_cluster_bad_server_and_bad_base64(tmp_path: Path) -> None:
    doc = config_doc()
    doc["contexts"][0]["context"]["cluster"] = "other"
    with pytest.raises(KubeconfigError, match="cluster 'other' is not defined"):
        load_client_config(str(write_yaml(tmp_path / "a", doc)))
    doc = config_doc(server="10.0.0.1:6443")
    with pytest.raises(KubeconfigError, match="no http"):
        load_client_config(str(write_yaml(tmp_path / "b", doc)))
    doc = config_doc(**{"certificate-authority-data": "not base64!"})
    with pytest.raises(KubeconfigError, match="not valid base64"):
        load_client_config(str(write_yaml(tmp_path / "c", doc)))
