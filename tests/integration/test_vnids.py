"""VNIDs through the real CLI: default is 0, join, isolate, global, and refcounted release."""

from __future__ import annotations

from typing import Any

import httpx

from podnet.testing.api import client_for, namespace
from podnet.testing.cli import run_podnet
from podnet.testing.e2e import wait_for
from podnet.testing.processes import MasterProcess

NETNS = "/apis/network.openshift.io/v1/netnamespaces"


def netids(api: httpx.Client) -> dict[str, int]:
    return {n["netname"]: n["netid"] for n in api.get(NETNS).json()["items"]}


def wait_netids(api: httpx.Client, names: set[str], timeout: float = 20.0) -> dict[str, int]:
    def all_there() -> dict[str, int] | None:
        ids = netids(api)
        return ids if names <= set(ids) else None

    return dict(wait_for(all_there, timeout, f"NetNamespaces {names}"))


def annotation(api: httpx.Client, name: str) -> Any:
    meta = api.get(f"{NETNS}/{name}").json()["metadata"]
    return (meta.get("annotations") or {}).get(
        "pod.network.openshift.io/multitenant.change-network"
    )


def test_vnid_lifecycle_through_the_cli(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        for name in ("a", "b", "c"):
            assert api.post("/api/v1/namespaces", json=namespace(name)).status_code == 201
        ids = wait_netids(api, {"default", "a", "b", "c"})
        assert ids["default"] == 0
        assert len({ids["a"], ids["b"], ids["c"]}) == 3
        assert all(10 <= ids[n] < 2**24 for n in "abc")

        joined = run_podnet(
            master.kubeconfig, "adm", "pod-network", "join-projects", "--to=a", "b", "c"
        )
        assert joined.returncode == 0, joined.stderr
        ids = netids(api)
        assert ids["b"] == ids["a"] == ids["c"]
        assert annotation(api, "b") is None

        isolated = run_podnet(master.kubeconfig, "adm", "pod-network", "isolate-projects", "b")
        assert isolated.returncode == 0, isolated.stderr
        after = netids(api)
        assert after["b"] not in (after["a"], 0)
        assert after["c"] == after["a"]

        # c leaves, so b's VNID ... and a's VNID is now used by a alone: isolating a keeps it.
        api.delete("/api/v1/namespaces/c")
        # The controller deletes c's NetNamespace and drops c as a user of a's VNID in one go.
        wait_for(lambda: "c" not in netids(api), 20, "c's NetNamespace to go")
        kept = after["a"]
        assert (
            run_podnet(master.kubeconfig, "adm", "pod-network", "isolate-projects", "a").returncode
            == 0
        )
        assert netids(api)["a"] == kept

        made_global = run_podnet(
            master.kubeconfig, "adm", "pod-network", "make-projects-global", "a"
        )
        assert made_global.returncode == 0, made_global.stderr
        assert netids(api)["a"] == 0
        assert "c" not in netids(api)


def test_cli_errors_are_one_line(master: MasterProcess) -> None:
    missing = run_podnet(
        master.kubeconfig, "adm", "pod-network", "join-projects", "--to=nope", "default"
    )
    assert missing.returncode == 1
    assert missing.stderr.strip().count("\n") == 0 and "nope" in missing.stderr
    assert "Traceback" not in missing.stderr
