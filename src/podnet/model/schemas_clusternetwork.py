"""ClusterNetwork: the one object (named ``default``) that sets the cluster's address plan.

Its shape is OpenShift's: fields at the top level, no spec. Besides field checks it has
cross-field rules (entries must not overlap each other or the service network) and change
rules: the cluster network may only grow to a superset, and hostSubnetLength,
serviceNetwork and vxlanPort are fixed once set.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping
from typing import Annotated

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from podnet.model.schemas_common import Problem, Schema, Strict, context_old, fail, reject
from podnet.model.schemas_names import quote
from podnet.model.schemas_types import IPv4Network, NonEmpty, Port, in_range, one_of

CLUSTER_NETWORK_NAME = "default"
PLUGIN_SUBNET = "redhat/openshift-ovs-subnet"
PLUGIN_MULTITENANT = "redhat/openshift-ovs-multitenant"
PLUGIN_NETWORKPOLICY = "redhat/openshift-ovs-networkpolicy"
DEFAULT_VXLAN_PORT = 4789
DEFAULT_MTU = 1450

Net = ipaddress.IPv4Network
PluginName = Annotated[
    str, AfterValidator(one_of(PLUGIN_SUBNET, PLUGIN_MULTITENANT, PLUGIN_NETWORKPOLICY))
]
Mtu = Annotated[int, AfterValidator(in_range(576, 65000))]


class ClusterNetworkEntry(Strict):
    CIDR: IPv4Network
    hostSubnetLength: int

    @model_validator(mode="after")
    def _length_fits(self) -> ClusterNetworkEntry:
        """Each node subnet must hold at least 4 addresses and fit inside the CIDR."""
        top = 32 - Net(self.CIDR).prefixlen
        if not 2 <= self.hostSubnetLength <= top:
            why = f"must be between 2 and {top} (32 minus the prefix length of {self.CIDR})"
            reject([Problem(("hostSubnetLength",), f"{self.hostSubnetLength} {why}")])
        return self


class ClusterNetworkBody(Strict):
    """Rules needing other fields read them from ``info.data`` (fields validated so far)."""

    clusterNetworks: Annotated[list[ClusterNetworkEntry], NonEmpty]
    network: IPv4Network | None = None
    hostsubnetlength: int | None = None
    serviceNetwork: IPv4Network
    pluginName: PluginName = PLUGIN_SUBNET
    vxlanPort: Port = Field(DEFAULT_VXLAN_PORT, validate_default=True)
    mtu: Mtu = DEFAULT_MTU

    @field_validator("clusterNetworks")
    @classmethod
    def _disjoint_and_growing(
        cls, entries: list[ClusterNetworkEntry], info: ValidationInfo
    ) -> list[ClusterNetworkEntry]:
        old = context_old(info)
        grow = _grow_problems(entries, old.get("clusterNetworks")) if old is not None else []
        reject([*_overlap_problems(entries), *grow])
        return entries

    @field_validator("network")
    @classmethod
    def _network_is_first(cls, value: str | None, info: ValidationInfo) -> str | None:
        first = _first_entry(info)
        if value is not None and first is not None and Net(value) != Net(first.CIDR):
            fail(f"{quote(value)} must match clusterNetworks[0].CIDR {first.CIDR}")
        return value

    @field_validator("hostsubnetlength")
    @classmethod
    def _length_is_first(cls, value: int | None, info: ValidationInfo) -> int | None:
        first = _first_entry(info)
        if value is not None and first is not None and value != first.hostSubnetLength:
            why = f"must match clusterNetworks[0].hostSubnetLength {first.hostSubnetLength}"
            fail(f"{value} {why}")
        return value

    @field_validator("serviceNetwork")
    @classmethod
    def _service_network_rules(cls, value: str, info: ValidationInfo) -> str:
        """Disjoint from the cluster networks, and fixed once set."""
        service = Net(value)
        for i, entry in enumerate(info.data.get("clusterNetworks") or []):
            if service.overlaps(Net(entry.CIDR)):
                fail(f"{quote(value)} overlaps clusterNetworks[{i}].CIDR {entry.CIDR}")
        old = context_old(info)
        was = _network(old.get("serviceNetwork")) if old is not None else None
        if was is not None and service != was:
            fail(f"may not change (was {was})")
        return value

    @field_validator("vxlanPort")
    @classmethod
    def _vxlan_port_fixed(cls, value: int, info: ValidationInfo) -> int:
        old = context_old(info)
        was = old.get("vxlanPort", DEFAULT_VXLAN_PORT) if old is not None else value
        if isinstance(was, int) and value != was:
            fail(f"may not change (was {was})")
        return value


def _first_entry(info: ValidationInfo) -> ClusterNetworkEntry | None:
    entries = info.data.get("clusterNetworks")
    return entries[0] if entries else None


def _overlap_problems(entries: list[ClusterNetworkEntry]) -> Iterator[Problem]:
    """No two entries may overlap. Paths are relative to the clusterNetworks list."""
    nets = [Net(e.CIDR) for e in entries]
    for i, net in enumerate(nets):
        for j in range(i):
            if net.overlaps(nets[j]):
                why = f"{quote(entries[i].CIDR)} overlaps clusterNetworks[{j}].CIDR {nets[j]}"
                yield Problem((i, "CIDR"), why)


# --- change rules --------------------------------------------------------------------------


def _grow_problems(entries: list[ClusterNetworkEntry], old: object) -> Iterator[Problem]:
    """Every old network must lie inside one new entry, with the same hostSubnetLength.

    Paths are relative to the clusterNetworks list.
    """
    nets = [Net(e.CIDR) for e in entries]
    for i, (old_net, old_length) in enumerate(_old_entries(old)):
        inside = [j for j, net in enumerate(nets) if old_net.subnet_of(net)]
        if inside:
            new_length = entries[inside[0]].hostSubnetLength
            if old_length is not None and new_length != old_length:
                why = f"may not change (was {old_length} for {old_net})"
                yield Problem((inside[0], "hostSubnetLength"), why)
            continue
        # Blame the entry that took the old network's place: one overlapping it, else the
        # one at its old position; if there is neither, the network was removed.
        overlapping = [j for j, net in enumerate(nets) if old_net.overlaps(net)]
        j = overlapping[0] if overlapping else i
        if j < len(nets):
            yield Problem((j, "CIDR"), f"may only grow to a superset of {old_net}")
        else:
            yield Problem((), f"may not remove {old_net}: the network may only grow to a superset")


def _old_entries(raw: object) -> Iterator[tuple[Net, int | None]]:
    """The old object's entries that parse; the old object is trusted, but not blindly."""
    for entry in raw if isinstance(raw, list) else []:
        net = _network(entry.get("CIDR") if isinstance(entry, Mapping) else None)
        if net is not None:
            length = entry.get("hostSubnetLength")
            yield net, length if isinstance(length, int) else None


def _network(value: object) -> Net | None:
    try:
        return Net(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _name_problem(name: str) -> str | None:
    return None if name == CLUSTER_NETWORK_NAME else f'must be "{CLUSTER_NETWORK_NAME}"'


SCHEMA = Schema(ClusterNetworkBody, name_rule=_name_problem)
