"""Every registered data plane implementation, ready for the one contract test suite.

``tests/integration/test_dataplane_contract.py`` runs the same tests against each name in
``podnet.dataplane.registry``. Here each name gets a *harness*: planes built by the
registry's own factory (``linux`` inside node 1 of a ``Lab``: an underlay namespace and a
node namespace, removed afterwards; ``fake`` needs none), the plain values of this node,
its remotes and pods (the lab's addressing for every implementation), and a read-only
view of what the implementation holds, in neutral terms: where each remote subnet is
sent, what a pod sees from inside, whether a policy is in force, and a snapshot that
changes when anything changes. ``drift_*`` break things the way an operator's hand would.

A new implementation adds its harness to ``podnet.testing.harnesses``; until it does, the contract
suite fails for it instead of leaving it untested. ``ovs`` runs like ``linux``, in node 1
of a lab, with its own OVS daemons stopped by PID at the end.
"""

from __future__ import annotations

import contextlib
import json
from abc import ABC, abstractmethod
from collections.abc import Container
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from pathlib import Path
from typing import Any, ClassVar, cast

from podnet import netns
from podnet.dataplane import registry
from podnet.dataplane.fake import FakeDataPlane
from podnet.dataplane.interface import DataPlane, NodeNetwork, PodNetwork, RemoteNode
from podnet.dataplane.linux.desired import BRIDGE, NFT_TABLE, POD_PORTS_SET, VXLAN, host_veth_name
from podnet.testing.e2e import wait_for
from podnet.testing.lab import Lab, policy_table, sh

NODE = 1  # the node under test; remotes use the lab's addressing of nodes 2, 3...
DEFAULT_ROUTE = IPv4Network("0.0.0.0/0")
Routes = frozenset[tuple[IPv4Network, IPv4Address]]  # (destination, gateway)


@dataclass(frozen=True)
class PodView:
    """A wired pod interface as the pod itself sees it."""

    address: IPv4Interface
    mac: str
    mtu: int
    routes: Routes

    @staticmethod
    def wanted(pod: PodNetwork) -> PodView:
        """What ``attach_pod(pod)`` promises: the default route and ``pod.routes``, all
        via the gateway."""
        routes = frozenset((dst, pod.gateway) for dst in (DEFAULT_ROUTE, *pod.routes))
        return PodView(pod.address, pod.mac, pod.mtu, routes)


class Harness(ABC):
    """One implementation under test, on node ``NODE`` of ``lab``."""

    name: ClassVar[str]
    needs_root: ClassVar[bool] = False
    lab_nodes: ClassVar[int] = 0  # lab nodes to build (0: no namespaces at all)

    def __init__(self, lab: Lab, state_dir: Path) -> None:
        self.lab = lab
        self.state_dir = state_dir
        self.planes: list[DataPlane] = []

    @property
    def plane(self) -> DataPlane:
        """The plane opened last (a restarted agent's, after ``open``)."""
        return self.planes[-1]

    def network(self, tunnel: str = "vxlan", **overrides: object) -> NodeNetwork:
        """This node's values."""
        return self.lab.network(NODE, tunnel, **overrides)

    def remote(self, i: int) -> RemoteNode:
        """Lab node ``i`` (never ``NODE``) as a remote."""
        return self.lab.remote(i)

    async def open(self) -> DataPlane:
        """A new plane from the registry's factory, on the same "kernel": a restart."""
        with self.inside():
            plane = await registry.create(self.name, registry.DataPlaneOptions(self.state_dir))
        self.planes.append(plane)
        return plane

    def inside(self) -> contextlib.AbstractContextManager[None]:
        """Where the factory runs: the node's network namespace."""
        return contextlib.nullcontext()

    async def close(self) -> None:
        """Close every plane opened (twice: closing again must be harmless)."""
        for plane in self.planes:
            await plane.close()
            await plane.close()

    @abstractmethod
    def pod(self, host: int, tag: str) -> PodNetwork:
        """A pod of this node at address ``host`` of its subnet, its sandbox ready."""

    @abstractmethod
    async def remote_routes(self) -> dict[IPv4Network, IPv4Address]:
        """Each remote subnet the node routes, and the node IP its traffic goes to."""

    @abstractmethod
    async def pod_view(self, pod: PodNetwork) -> PodView | None:
        """``pod``'s interface as wired (None when it is not)."""

    @abstractmethod
    async def leftovers(self, pod: PodNetwork) -> list[str]:
        """Whatever of ``pod`` the node still holds."""

    @abstractmethod
    async def policy_in_force(self) -> bool:
        """Whether any isolation or policy rule is in force."""

    @abstractmethod
    async def services_in_force(self) -> bool:
        """Whether any service is forwarded (or rejected for lack of endpoints)."""

    @abstractmethod
    async def egress_firewalled(self) -> set[str]:
        """The addresses of the pods whose way out the egress firewall judges."""

    @abstractmethod
    async def snapshot(self) -> Any:
        """Everything the node holds, down to identities (equal: nothing changed)."""

    @abstractmethod
    async def drift_node(self) -> None:
        """Break the node's own set-up by hand."""

    @abstractmethod
    async def drift_remote(self, remote: RemoteNode) -> None:
        """Remove the route to ``remote`` by hand."""

    @abstractmethod
    async def drift_sandbox_gone(self, pod: PodNetwork) -> None:
        """Delete ``pod``'s network namespace behind the plane's back (a runtime that
        crashed, or removed a sandbox without a DEL)."""


class FakeHarness(Harness):
    """``fake``: its state file plays the kernel; the views read the plane opened last."""

    name = "fake"

    @property
    def fake(self) -> FakeDataPlane:
        return cast("FakeDataPlane", self.plane)

    def pod(self, host: int, tag: str) -> PodNetwork:
        return self.lab.pod_network(NODE, host, tag, f"/run/netns/{self.lab.run}-p-{tag}")

    async def remote_routes(self) -> dict[IPv4Network, IPv4Address]:
        return {r.subnet: r.node_ip for r in self.fake.state.remotes.values()}

    async def pod_view(self, pod: PodNetwork) -> PodView | None:
        key = (pod.container_id, pod.ifname)
        wired = self.fake.state.pods.get(key)
        if wired is None:
            return None
        extra = self.fake.state.pod_routes.get(key, ())
        routes = frozenset((dst, wired.gateway) for dst in (DEFAULT_ROUTE, *extra))
        return PodView(wired.address, wired.mac, wired.mtu, routes)

    async def leftovers(self, pod: PodNetwork) -> list[str]:
        key, state = (pod.container_id, pod.ifname), self.fake.state
        held: dict[str, Container[tuple[str, str]]] = {
            "pods": state.pods,
            "pod_routes": state.pod_routes,
        }
        return [f"{key} in {name}" for name, found in held.items() if key in found]

    async def policy_in_force(self) -> bool:
        policy = self.fake.state.policy
        return policy is not None and policy.size().rules > 0

    async def services_in_force(self) -> bool:
        return bool(self.fake.state.services and self.fake.state.services.ports)

    async def egress_firewalled(self) -> set[str]:
        found = self.fake.egress_firewall
        return {str(ip) for ip in found.pods} if found else set()

    async def snapshot(self) -> Any:
        state = self.fake.state
        return (
            state.version_note,
            sorted(state.remotes.items()),
            sorted(state.pods.items()),
            sorted(state.pod_routes.items()),
            state.policy_fingerprint,
            state.services,
        )

    async def drift_node(self) -> None:
        self.fake.drift_version_note()

    async def drift_remote(self, remote: RemoteNode) -> None:
        self.fake.drift_remove_remote(remote.name)

    async def drift_sandbox_gone(self, pod: PodNetwork) -> None:
        self.fake.drift_sandbox_gone(pod.container_id, pod.ifname)


class LinuxHarness(Harness):
    """``linux``: node 1 of a lab; the views read the kernel with ``ip``, ``bridge``,
    ``nft`` (not through the plane's own code)."""

    name = "linux"
    needs_root = True
    lab_nodes = 1

    @property
    def ns(self) -> str:
        return self.lab.node_ns(NODE)

    def inside(self) -> contextlib.AbstractContextManager[None]:
        return netns.entered(self.ns)

    def pod(self, host: int, tag: str) -> PodNetwork:
        return self.lab.pod(NODE, host, tag)[1]

    async def remote_routes(self) -> dict[IPv4Network, IPv4Address]:
        found = {}
        vtep_of = {n["dst"]: n.get("lladdr") for n in json_output(self.ns, "ip", "neigh", "show")}
        node_of = {f["mac"]: f.get("dst") for f in json_output(self.ns, "bridge", "fdb", "show")}
        for route in json_output(self.ns, "ip", "route", "show", "proto", "80"):
            if "gateway" not in route:  # the service network onto br0: node set-up
                continue
            via = route["gateway"]
            if route["dev"] == VXLAN:  # via the remote subnet's .0, a VTEP, a node IP
                via = node_of.get(vtep_of.get(via))
            found[IPv4Network(route["dst"])] = IPv4Address(via)
        return found

    async def pod_view(self, pod: PodNetwork) -> PodView | None:
        if not Path(pod.netns).exists():
            return None
        argv = ["ip", "-j", "addr", "show", "dev", pod.ifname]
        done = netns.run(pod.netns, argv, timeout=30)
        if done.returncode != 0:
            return None
        (link,) = json.loads(done.stdout)
        (inet,) = [a for a in link["addr_info"] if a["family"] == "inet"]
        routes = json_output(pod.netns, "ip", "route", "show", "dev", pod.ifname)
        return PodView(
            IPv4Interface(f"{inet['local']}/{inet['prefixlen']}"),
            link["address"],
            link["mtu"],
            frozenset(
                (IPv4Network(r["dst"].replace("default", "0.0.0.0/0")), IPv4Address(r["gateway"]))
                for r in routes
                if "gateway" in r
            ),
        )

    async def leftovers(self, pod: PodNetwork) -> list[str]:
        host = host_veth_name(pod.container_id, pod.ifname)
        ports = sh(self.ns, "nft", "list", "set", "bridge", NFT_TABLE, POD_PORTS_SET)
        places = {"link": sh(self.ns, "ip", "link"), POD_PORTS_SET: ports}
        return [f"{host} in {where}" for where, text in places.items() if host in text]

    async def policy_in_force(self) -> bool:
        return policy_table(self.ns) is not None

    async def services_in_force(self) -> bool:
        listed = netns.run(self.ns, ["nft", "list", "table", "ip", "podnet_services"], timeout=30)
        return listed.returncode == 0

    async def egress_firewalled(self) -> set[str]:
        argv = ["nft", "-j", "list", "map", "inet", "podnet_egress", "pods"]
        listed = netns.run(self.ns, argv, timeout=30)
        if listed.returncode != 0:
            return set()
        items = json.loads(listed.stdout)["nftables"]
        elements = next(i["map"] for i in items if "map" in i).get("elem") or []
        return {str(pair[0]) for pair in elements}

    async def snapshot(self) -> Any:
        return snapshot(self.ns)

    async def drift_node(self) -> None:
        sh(self.ns, "ip", "link", "set", BRIDGE, "mtu", "1400")

    async def drift_remote(self, remote: RemoteNode) -> None:
        sh(self.ns, "ip", "route", "del", str(remote.subnet))

    async def drift_sandbox_gone(self, pod: PodNetwork) -> None:
        assert netns.remove(Path(pod.netns).name), f"{pod.netns} was not there"
        # the kernel frees a namespace (and with it both ends of the veth) a moment later
        host = host_veth_name(pod.container_id, pod.ifname)
        gone = lambda: netns.run(self.ns, ["ip", "link", "show", host]).returncode != 0  # noqa: E731
        wait_for(gone, 10, f"{host} to go with its pod's namespace", interval=0.05)


def snapshot(ns: str) -> tuple[str, ...]:
    """Links (with their indexes), addresses, podnet's routes, permanent neighbours, tunnel
    FDB entries and the nft ruleset with rule handles, of namespace ``ns``: equal
    snapshots mean nothing was re-made, not even a link or a rule with the same content.
    (What the kernel changes by itself is left out: a link's carrier and operational
    state, which settle just after a pod is wired, and what the bridge learns.)"""
    fdb = sh(ns, "bridge", "fdb", "show").splitlines()
    return (
        "\n".join(_link_identity(link) for link in json_output(ns, "ip", "-d", "link", "show")),
        sh(ns, "ip", "-4", "-o", "addr", "show"),
        sh(ns, "ip", "route", "show", "proto", "80"),
        sh(ns, "ip", "neigh", "show", "nud", "permanent"),
        "\n".join(line for line in fdb if " dst " in line),
        sh(ns, "nft", "-a", "list", "ruleset"),
    )


def _link_identity(link: dict[str, Any]) -> str:
    """A link's index, name, kind, settings and admin state (not its carrier)."""
    info = link.get("linkinfo", {})
    kind = info.get("info_kind", "")
    details = sorted(info.get("info_data", {}).items()) if kind == "vxlan" else []
    up = "UP" in link["flags"]
    return (
        f"{link['ifindex']} {link['ifname']} {kind} mtu {link['mtu']} {link.get('address')} "
        f"master {link.get('master')} up {up} alias {link.get('ifalias')} {details}"
    )


def json_output(ns: str, *argv: str) -> list[dict[str, Any]]:
    """``argv`` with ``-j`` (JSON output) in namespace ``ns``."""
    return cast("list[dict[str, Any]]", json.loads(sh(ns, argv[0], "-j", *argv[1:]) or "[]"))
