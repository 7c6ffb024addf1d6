"""CNI types: result formats per version, errors, CNI_ARGS, network config, requests."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from podnet.cni import validate
from podnet.cni.result import (
    DNS,
    CniResult,
    Interface,
    IPConfig,
    Route,
    format_result,
    parse_result,
)
from podnet.cni.types import (
    SUPPORTED_VERSIONS,
    Attachment,
    CniError,
    error_answer,
    http_status_for,
    parse_cni_args,
    parse_network_config,
    parse_request,
    result_answer,
)

RESULT = CniResult(
    interfaces=(
        Interface("veth1234", mac="0a:58:0a:80:00:01", mtu=1450),
        Interface("eth0", mac="0a:58:0a:80:00:05", mtu=1450, sandbox="/var/run/netns/pod"),
    ),
    ips=(
        IPConfig("10.128.0.5/23", gateway="10.128.0.1", interface=1),
        IPConfig("fd00::5/64", interface=1),
    ),
    routes=(Route("0.0.0.0/0", gw="10.128.0.1", mtu=1400), Route("10.128.0.0/14")),
    dns=DNS(nameservers=("172.30.0.10",), search=("a.svc.cluster.local",)),
)


def config_text(**fields: Any) -> str:
    return json.dumps({"cniVersion": "1.0.0", "name": "podnet", "type": "podnet", **fields})


# ---- results ----


@pytest.mark.parametrize("version", ["0.3.0", "0.3.1", "0.4.0"])
def test_legacy_format_has_ip_versions_and_no_extras(version: str) -> None:
    out = format_result(RESULT, version)
    assert out["cniVersion"] == version
    assert [ip["version"] for ip in out["ips"]] == ["4", "6"]
    assert out["ips"][0] == {
        "version": "4",
        "address": "10.128.0.5/23",
        "gateway": "10.128.0.1",
        "interface": 1,
    }
    assert all("mtu" not in iface for iface in out["interfaces"])
    assert out["routes"][0] == {"dst": "0.0.0.0/0", "gw": "10.128.0.1"}


def test_1_0_0_format_drops_ip_versions() -> None:
    out = format_result(RESULT, "1.0.0")
    assert out["ips"][1] == {"address": "fd00::5/64", "interface": 1}
    assert "mtu" not in out["interfaces"][0] and "mtu" not in out["routes"][0]


def test_1_1_0_format_has_mtus() -> None:
    out = format_result(RESULT, "1.1.0")
    assert out["interfaces"][1] == {
        "name": "eth0",
        "mac": "0a:58:0a:80:00:05",
        "mtu": 1450,
        "sandbox": "/var/run/netns/pod",
    }
    assert out["routes"] == [
        {"dst": "0.0.0.0/0", "gw": "10.128.0.1", "mtu": 1400},
        {"dst": "10.128.0.0/14"},
    ]
    assert out["dns"] == {"nameservers": ["172.30.0.10"], "search": ["a.svc.cluster.local"]}


def test_empty_result_keeps_only_version_and_dns() -> None:
    assert format_result(CniResult(), "1.1.0") == {"cniVersion": "1.1.0", "dns": {}}


def test_format_refuses_unsupported_version() -> None:
    with pytest.raises(CniError) as info:
        format_result(RESULT, "0.2.0")
    assert info.value.code == validate.ERR_INCOMPATIBLE_VERSION


_addr = st.one_of(
    st.ip_addresses(v=4).map(lambda a: f"{a}/24"), st.ip_addresses(v=6).map(lambda a: f"{a}/64")
)
_small = st.one_of(st.none(), st.integers(1, 9000))
_name = st.text("abcdefgh0123456789", min_size=1, max_size=15)
_results = st.builds(
    CniResult,
    interfaces=st.lists(
        st.builds(Interface, _name, st.just(""), _small, st.just("")), max_size=3
    ).map(tuple),
    ips=st.lists(
        st.builds(IPConfig, _addr, st.none(), st.none() | st.integers(0, 2)), max_size=3
    ).map(tuple),
    routes=st.lists(st.builds(Route, _addr, st.none(), _small, _small), max_size=3).map(tuple),
)


@given(result=_results, version=st.sampled_from(SUPPORTED_VERSIONS))
def test_result_round_trip(result: CniResult, version: str) -> None:
    parsed = parse_result(json.loads(json.dumps(format_result(result, version))))
    if version == "1.1.0":
        assert parsed == result
    else:  # older formats have no MTUs
        assert [i.name for i in parsed.interfaces] == [i.name for i in result.interfaces]
        assert parsed.ips == result.ips
        assert [r.dst for r in parsed.routes] == [r.dst for r in result.routes]


@pytest.mark.parametrize(
    "bad",
    [
        {"ips": [{"address": "10.0.0.300/24"}]},
        {"ips": [{"gateway": "10.0.0.1"}]},
        {"ips": "10.0.0.1/24"},
        {"interfaces": [{"name": 5}]},
        {"routes": [{"gw": "10.0.0.1"}]},
        {"dns": {"nameservers": [1]}},
    ],
)
def test_parse_result_rejects_malformed(bad: dict[str, Any]) -> None:
    with pytest.raises(CniError) as info:
        parse_result(bad)
    assert info.value.code == validate.ERR_INVALID_NETWORK_CONFIG


# ---- errors ----


def test_error_json() -> None:
    err = CniError(validate.ERR_TRY_AGAIN_LATER, "agent busy", "retry")
    assert json.loads(err.to_json("0.4.0")) == {
        "cniVersion": "0.4.0",
        "code": 11,
        "msg": "agent busy",
        "details": "retry",
    }
    assert err.to_dict()["cniVersion"] == "1.1.0"


@pytest.mark.parametrize(
    ("code", "status"), [(1, 400), (4, 400), (7, 400), (11, 503), (50, 503), (3, 400), (100, 500)]
)
def test_http_status_for(code: int, status: int) -> None:
    assert http_status_for(code) == status


# ---- CNI_ARGS ----


def test_parse_cni_args() -> None:
    text = "IgnoreUnknown=1;K8S_POD_NAMESPACE=a;K8S_POD_NAME=b"
    assert parse_cni_args(text) == {
        "IgnoreUnknown": "1",
        "K8S_POD_NAMESPACE": "a",
        "K8S_POD_NAME": "b",
    }
    assert parse_cni_args("") == {}
    assert parse_cni_args("A=;B=2;") == {"A": "", "B": "2"}


@pytest.mark.parametrize("text", ["A", "=1", "A=1=2", "A=1;B"])
def test_parse_cni_args_rejects_bad_pairs(text: str) -> None:
    with pytest.raises(CniError) as info:
        parse_cni_args(text)
    assert info.value.code == validate.ERR_INVALID_ENVIRONMENT


def test_parse_cni_args_unknown_keys() -> None:
    known = {"K8S_POD_NAME", "K8S_POD_NAMESPACE"}
    with pytest.raises(CniError, match="unknown CNI_ARGS"):
        parse_cni_args("K8S_POD_NAME=b;FOO=1", known)
    assert parse_cni_args("IgnoreUnknown=true;FOO=1", known) == {
        "IgnoreUnknown": "true",
        "FOO": "1",
    }


# ---- network config ----


def test_parse_network_config() -> None:
    prev = format_result(RESULT, "1.0.0")
    config = parse_network_config(
        config_text(socketPath="/run/p.sock", mtu=1450, namespace="node-a", prevResult=prev)
    )
    assert (config.name, config.type, config.cni_version) == ("podnet", "podnet", "1.0.0")
    assert (config.socket_path, config.mtu, config.namespace) == ("/run/p.sock", 1450, "node-a")
    assert config.prev_result is not None and config.prev_result.ips == RESULT.ips
    assert config.runtime_config == {} and config.valid_attachments is None


def test_parse_gc_attachments() -> None:
    attachments = [{"containerID": "abc", "ifname": "eth0"}]
    text = config_text(cniVersion="1.1.0", **{"cni.dev/valid-attachments": attachments})
    assert parse_network_config(text, "GC").valid_attachments == (Attachment("abc", "eth0"),)


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("{", 6),
        ("[]", 6),
        ('{"cniVersion": "1.0.0", "name": "n", "type": "t", "x": Infinity}', 6),
        ('{"cniVersion": "1.0.0", "type": "podnet"}', 7),
        ('{"cniVersion": "1.0.0", "name": "", "type": "podnet"}', 7),
        ('{"cniVersion": "1.0.0", "name": "podnet"}', 7),
        ('{"cniVersion": "9.9.9", "name": "n", "type": "t"}', 1),
        (config_text(mtu=10), 7),
        (config_text(mtu="1450"), 7),
        (config_text(ipam=[]), 7),
        (config_text(runtimeConfig="x"), 7),
        (config_text(prevResult={"ips": [{"address": "bad"}]}), 7),
    ],
)
def test_parse_network_config_errors(text: str, code: int) -> None:
    with pytest.raises(CniError) as info:
        parse_network_config(text)
    assert info.value.code == code


def test_check_needs_0_4_0() -> None:
    with pytest.raises(CniError) as info:
        parse_network_config(config_text(cniVersion="0.3.1"), "CHECK")
    assert info.value.code == validate.ERR_INCOMPATIBLE_VERSION
    assert parse_network_config(config_text(cniVersion="0.4.0"), "CHECK").cni_version == "0.4.0"


# ---- requests from the shims ----

ENV = {
    "CNI_COMMAND": "ADD",
    "CNI_CONTAINERID": "abc",
    "CNI_NETNS": "/var/run/netns/pod",
    "CNI_IFNAME": "eth0",
    "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=a;K8S_POD_NAME=b",
    "CNI_PATH": "/opt/cni/bin:/usr/lib/cni",
}


def body(env: dict[str, str], config: str) -> bytes:
    return json.dumps({"env": env, "config": config}).encode()


def test_parse_request() -> None:
    req = parse_request(body(ENV, config_text(cniVersion="0.4.0")))
    assert (req.command, req.container_id, req.netns, req.ifname) == (
        "ADD",
        "abc",
        ENV["CNI_NETNS"],
        "eth0",
    )
    assert req.args["K8S_POD_NAME"] == "b" and req.path == ("/opt/cni/bin", "/usr/lib/cni")
    assert req.config is not None and req.cni_version == "0.4.0"
    status, answer = result_answer(CniResult(ips=(IPConfig("10.128.0.5/23"),)), req.cni_version)
    assert status == 200
    assert json.loads(answer)["ips"] == [{"version": "4", "address": "10.128.0.5/23"}]
    assert result_answer(None, req.cni_version) == (200, b"")


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (b"not json", 6),
        (b'{"env": {}, "config": 5}', 6),
        (b'{"env": {"CNI_COMMAND": 1}, "config": ""}', 6),
        (body({**ENV, "CNI_IFNAME": "a" * 16}, config_text()), 4),
        (body({**ENV, "CNI_ARGS": "K8S_POD_NAME"}, config_text()), 4),
        (body(ENV, "{"), 6),
        (body(ENV, config_text(cniVersion="0.1.0")), 1),
    ],
)
def test_parse_request_errors(payload: bytes, code: int) -> None:
    with pytest.raises(CniError) as info:
        parse_request(payload)
    assert info.value.code == code


def test_request_errors_answer_in_config_version() -> None:
    with pytest.raises(CniError) as info:
        parse_request(body({**ENV, "CNI_NETNS": ""}, config_text(cniVersion="0.3.1")))
    status, answer = error_answer(info.value)
    assert status == 400
    assert json.loads(answer) == {
        "cniVersion": "0.3.1",
        "code": 4,
        "msg": "required environment variables missing",
        "details": "CNI_NETNS",
    }


# ---- the shared validation ----


def test_version_accepts_any_stdin() -> None:
    req = validate.validate_request({"CNI_COMMAND": "VERSION"}, b"\xff garbage")
    assert (req.command, req.cni_version) == ("VERSION", "1.1.0")
    assert validate.version_answer({"cniVersion": "0.3.1"})["cniVersion"] == "0.3.1"


@pytest.mark.parametrize("name", ["eth0", "e" * 15, "net1.100", "é" * 7])
def test_good_ifnames(name: str) -> None:
    validate.check_ifname(name)


@pytest.mark.parametrize("name", ["e" * 16, "é" * 8, ".", "..", "a/b", "a:b", "a\tb", "a\u3000b"])
def test_bad_ifnames(name: str) -> None:
    with pytest.raises(CniError):
        validate.check_ifname(name)


def test_del_and_gc_need_less_environment() -> None:
    validate.check_env("DEL", {"CNI_CONTAINERID": "abc", "CNI_IFNAME": "eth0"})
    validate.check_env("GC", {})
    validate.check_env("STATUS", {})
    with pytest.raises(CniError, match="CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME"):
        validate.check_env("CHECK", {})
