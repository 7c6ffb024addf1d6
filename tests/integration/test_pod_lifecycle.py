"""Issue 19, findings 1 (lifecycle half), 4 and 10, against real processes: a real etcd,
a real ``podnet master``, a real ``podnet node`` (fake data plane), the real CNI shim and
the real kubectl.

- ``kubectl delete pod``: the Pod turns terminating and stays while its sandbox runs;
  the node finalizes it after the CNI DEL; without a DEL, once the grace runs out, the
  node detaches the sandbox and removes the Pod; ``--force --grace-period=0`` removes
  it at once and the node detaches the orphan. A later DEL still succeeds.
- An address released by CNI GC is cleared from its Pod and rests: the next pod given
  it gets its own identity (its status written; a protected pod stays out of reach).
- A mirror Pod goes with its sandbox's DEL.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_agent_fake_dataplane import NODE, Agent, Shim

from podnet.cni.build import install_shim
from podnet.master import node_credentials
from podnet.policy.compile import compile_rules, hostsubnet_addresses
from podnet.policy.evaluate import evaluate
from podnet.store.etcd_process import EtcdProcess
from podnet.testing.api import client_for, namespace, pod
from podnet.testing.cli import run_kubectl
from podnet.testing.e2e import wait_for
from podnet.testing.processes import MasterProcess, launch_master

PODS = "/api/v1/namespaces/default/pods"


class MetricsAgent(Agent):
    """The agent with ``/metrics`` on a loopback port of its choosing."""

    def command(self) -> list[str]:
        return [*super().command(), "--metrics-address", "127.0.0.1:0"]

    def metrics(self) -> str:
        found = re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", self.log(0))
        assert found, self.log(0)[-2000:]
        return httpx.get(found.group(1), timeout=10).text


def _metric(text: str, name: str, **labels: str) -> float:
    """One sample of ``name`` with exactly ``labels``; 0 when absent."""
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf"^{re.escape(name)}{re.escape('{' + wanted + '}') if wanted else ''} (\S+)$"
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _wait(condition: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    return wait_for(condition, timeout, what)


@pytest.fixture
def cooldown(monkeypatch: pytest.MonkeyPatch) -> float:
    """A short IPAM cool-down for the agents started after it (they inherit the env)."""
    monkeypatch.setenv("PODNET_IPAM_COOLDOWN_SECONDS", "4")
    return 4.0


def _start(master: MasterProcess, root: Path) -> MetricsAgent:
    kubeconfig = node_credentials(master.state_dir, NODE, master.server, root / "node.kubeconfig")
    agent = MetricsAgent(root, kubeconfig)
    agent.start()
    return agent


@pytest.fixture
def agent(master: MasterProcess, tmp_path: Path, cooldown: float) -> Iterator[MetricsAgent]:
    running = _start(master, tmp_path / "agent")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def shim(agent: Agent) -> Shim:
    return Shim(install_shim(agent.root / "shim-bin", sys.executable), agent.socket)


def _pod(master: MasterProcess, name: str, ns: str = "default") -> dict[str, Any] | None:
    with client_for(master.kubeconfig) as api:
        answer = api.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    if answer.status_code == 404:
        return None
    answer.raise_for_status()
    found: dict[str, Any] = answer.json()
    return found


def _pod_ip(master: MasterProcess, name: str, ns: str = "default") -> str | None:
    found = _pod(master, name, ns)
    return ((found or {}).get("status") or {}).get("podIP")


def _create_bound(master: MasterProcess, name: str, ns: str = "default", **spec: Any) -> None:
    body = pod(name, ns, NODE)
    body["spec"].update(spec)
    with client_for(master.kubeconfig) as api:
        answer = api.post(f"/api/v1/namespaces/{ns}/pods", json=body)
    assert answer.status_code == 201, answer.text


def _attached(agent: Agent) -> dict[str, str]:
    """container ID -> address of every attachment in the fake data plane."""
    return {p["container_id"]: p["address"].split("/")[0] for p in agent.fake_state()["pods"]}


def _add(shim: Shim, cid: str, name: str, ns: str = "default") -> tuple[int, Any]:
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid, "CNI_IFNAME": "eth0"}
    env |= {"CNI_NETNS": f"/var/run/netns/{cid}"}
    env["CNI_ARGS"] = f"IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name}"
    code, out, _ = shim.run(env)
    return code, out


def _running(master: MasterProcess, shim: Shim, name: str, **spec: Any) -> str:
    """A Pod bound to the node, its sandbox added, its IP written; returns the IP."""
    _create_bound(master, name, **spec)
    code, out = shim.add(f"cid-{name}", name)
    assert code == 0, out
    ip = str(out["ips"][0]["address"]).split("/")[0]
    _wait(lambda: _pod_ip(master, name) == ip, f"{name}'s IP on its Pod")
    return ip


def test_kubectl_delete_is_graceful_and_the_node_finalizes_after_the_del(
    master: MasterProcess, agent: MetricsAgent, shim: Shim
) -> None:
    _running(master, shim, "web")
    deleted = run_kubectl(master.kubeconfig, "delete", "pod", "web", "--wait=false")
    assert deleted.returncode == 0, deleted.stderr
    terminating = _pod(master, "web")
    assert terminating is not None, "the Pod went at once: no graceful deletion"
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 30
    assert terminating["metadata"]["deletionTimestamp"]
    time.sleep(2)  # the node has had its chance to get it wrong: the sandbox still runs
    assert _pod(master, "web") is not None and "cid-web" in _attached(agent)
    assert shim.delete("cid-web", pod="web")[0] == 0
    _wait(lambda: _pod(master, "web") is None, "the node to finalize the Pod after the DEL")
    assert _metric(agent.metrics(), "podnet_agent_pod_finalizations_total") == 1
    assert "pod default/web finalized" in agent.log()


def test_without_a_del_the_node_tears_down_once_the_grace_runs_out(
    master: MasterProcess, agent: MetricsAgent, shim: Shim
) -> None:
    ip = _running(master, shim, "slow", terminationGracePeriodSeconds=3)
    keep_ip = _running(master, shim, "keep")
    deleted = run_kubectl(master.kubeconfig, "delete", "pod", "slow", "--wait=false")
    assert deleted.returncode == 0, deleted.stderr
    assert (_pod(master, "slow") or {})["metadata"]["deletionGracePeriodSeconds"] == 3
    _wait(lambda: "cid-slow" not in _attached(agent), "the sandbox detached after its grace")
    assert ip not in agent.ip_files()  # its address released
    _wait(lambda: _pod(master, "slow") is None, "the Pod removed by its node")
    metrics = agent.metrics()
    assert _metric(metrics, "podnet_agent_pod_teardowns_total", reason="grace period over") == 1
    assert "grace period over: detached cid-slow/eth0" in agent.log()
    assert shim.delete("cid-slow", pod="slow")[0] == 0  # the runtime's DEL, later: fine
    assert _attached(agent) == {"cid-keep": keep_ip}  # the other pod is untouched
    assert _pod_ip(master, "keep") == keep_ip


def test_force_delete_removes_the_pod_at_once_and_the_node_detaches_the_orphan(
    master: MasterProcess, agent: MetricsAgent, shim: Shim
) -> None:
    ip = _running(master, shim, "gone")
    forced = run_kubectl(master.kubeconfig, "delete", "pod", "gone", "--force", "--grace-period=0")
    assert forced.returncode == 0, forced.stderr
    assert _pod(master, "gone") is None
    _wait(lambda: "cid-gone" not in _attached(agent), "the orphan's network torn down")
    assert ip not in agent.ip_files()
    metrics = agent.metrics()
    assert _metric(metrics, "podnet_agent_pod_teardowns_total", reason="pod object gone") == 1
    assert shim.delete("cid-gone", pod="gone")[0] == 0


def test_a_mirror_pod_goes_with_its_sandbox(
    master: MasterProcess, agent: MetricsAgent, shim: Shim
) -> None:
    """Finding 10: a runtime-started pod's mirror Pod stayed Running after the DEL."""
    code, out = shim.add("cid-runtime", "runtime")
    assert code == 0, out
    ip = str(out["ips"][0]["address"]).split("/")[0]
    _wait(lambda: _pod_ip(master, "runtime") == ip, "the mirror Pod with the pod's IP")
    assert shim.delete("cid-runtime", pod="runtime")[0] == 0
    _wait(lambda: _pod(master, "runtime") is None, "the mirror Pod deleted after the DEL")
    time.sleep(2)  # no status write brings it back
    assert _pod(master, "runtime") is None


# ---- finding 4: an address released by GC ------------------------------------------------


def _rules(master: MasterProcess) -> Any:
    paths = {
        "pods": "/api/v1/pods",
        "namespaces": "/api/v1/namespaces",
        "netnamespaces": "/apis/network.openshift.io/v1/netnamespaces",
        "policies": "/apis/networking.k8s.io/v1/networkpolicies",
        "hostsubnets": "/apis/network.openshift.io/v1/hostsubnets",
    }
    with client_for(master.kubeconfig) as api:
        items = {name: api.get(path).json()["items"] for name, path in paths.items()}
    return compile_rules(
        "redhat/openshift-ovs-networkpolicy",
        items["pods"],
        items["namespaces"],
        items["netnamespaces"],
        items["policies"],
        node_ips=[hs["hostIP"] for hs in items["hostsubnets"]],
        node_addresses=[pair for hs in items["hostsubnets"] for pair in hostsubnet_addresses(hs)],
    )


def test_an_address_released_by_gc_leaves_its_pod_and_rests(
    etcd: EtcdProcess, tmp_path: Path, prefix: str, cooldown: float
) -> None:
    """Finding 4: GC released pod A's address, A's Pod kept it, and pod B (in a denied
    namespace) got it: B's own status was refused and B reached a protected pod as A."""
    master = launch_master(
        etcd, tmp_path / "master", prefix,
        "--network-plugin", "networkpolicy", "--cluster-network", "10.128.0.0/14:3",
    )  # fmt: skip
    agent = None
    try:
        agent = _start(master, tmp_path / "agent")
        shim = Shim(install_shim(agent.root / "shim-bin", sys.executable), agent.socket)
        with client_for(master.kubeconfig) as api:
            for ns, team in (("friends", "a"), ("strangers", "b"), ("vault", "v")):
                api.post("/api/v1/namespaces", json=namespace(ns, {"team": team}))
            policy = {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": "friends-only", "namespace": "vault"},
                "spec": {
                    "podSelector": {},
                    "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}]}],
                },
            }
            path = "/apis/networking.k8s.io/v1/namespaces/vault/networkpolicies"
            api.post(path, json=policy).raise_for_status()
        # A /29: five addresses. The vault, A (a friend) and three fillers take them all.
        ips: dict[str, str] = {}
        for cid, name, ns in (
            ("cid-vault", "safe", "vault"),
            ("cid-a", "a", "friends"),
            *((f"cid-f{i}", f"f{i}", "vault") for i in range(3)),
        ):
            _create_bound(master, name, ns)
            code, out = _add(shim, cid, name, ns)
            assert code == 0, out
            ips[name] = str(out["ips"][0]["address"]).split("/")[0]
            _wait(lambda n=name, s=ns: _pod_ip(master, n, s) == ips[n], f"{name}'s IP")
        _create_bound(master, "b", "strangers")
        assert _add(shim, "cid-b", "b", "strangers")[0] != 0  # full

        shim.cni_version = "1.1.0"
        valid = [{"containerID": c, "ifname": "eth0"} for c in ("cid-vault", "cid-f0")]
        valid += [{"containerID": c, "ifname": "eth0"} for c in ("cid-f1", "cid-f2")]
        gc = shim.run({"CNI_COMMAND": "GC"}, shim.config(**{"cni.dev/valid-attachments": valid}))
        assert gc[0] == 0, gc
        _wait(lambda: _pod_ip(master, "a", "friends") is None, "A's Pod to drop the released IP")
        shim.cni_version = "1.0.0"
        code, out = _add(shim, "cid-b", "b", "strangers")
        assert code != 0, f"B got {out} while the address still rests"

        def added() -> Any:
            code, out = _add(shim, "cid-b", "b", "strangers")
            return out if code == 0 else None

        out = _wait(added, "B's ADD once the address has rested", 30)
        b_ip = str(out["ips"][0]["address"]).split("/")[0]
        assert b_ip == ips["a"]  # the only free address: A's old one
        _wait(lambda: _pod_ip(master, "b", "strangers") == b_ip, "B's own status written")
        rules = _rules(master)
        verdict = evaluate(rules, b_ip, ips["safe"], "TCP", 8080)
        assert not verdict.allowed, verdict
        assert "strangers/b" in verdict.src, verdict
    finally:
        if agent is not None:
            agent.stop()
        master.stop()


def test_a_namespace_deletion_waits_for_its_pods_to_be_finalized(
    master: MasterProcess, agent: MetricsAgent, shim: Shim
) -> None:
    """The namespace controller deletes a namespace's pods the same graceful way: the
    Namespace is finalized once the node has torn down and finalized them."""
    with client_for(master.kubeconfig) as api:
        api.post("/api/v1/namespaces", json=namespace("doomed")).raise_for_status()
    _create_bound(master, "inside", "doomed", terminationGracePeriodSeconds=3)
    code, out = _add(shim, "cid-inside", "inside", "doomed")
    assert code == 0, out
    ip = str(out["ips"][0]["address"]).split("/")[0]
    _wait(lambda: _pod_ip(master, "inside", "doomed") == ip, "the pod's IP")
    deleted = run_kubectl(master.kubeconfig, "delete", "namespace", "doomed", "--wait=false")
    assert deleted.returncode == 0, deleted.stderr
    _wait(
        lambda: ((_pod(master, "inside", "doomed") or {}).get("metadata") or {}).get(
            "deletionTimestamp"
        ),
        "the namespace controller's graceful pod deletion",
    )
    with client_for(master.kubeconfig) as api:
        assert api.get("/api/v1/namespaces/doomed").status_code == 200  # still terminating

        def namespace_gone() -> bool:
            return api.get("/api/v1/namespaces/doomed").status_code == 404

        _wait(namespace_gone, "the namespace finalized once its pod is gone")
    assert "cid-inside" not in _attached(agent) and ip not in agent.ip_files()
    assert shim.delete("cid-inside", pod="inside")[0] == 0
