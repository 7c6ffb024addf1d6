"""The ``ovs`` data plane: OpenShift SDN's br0 OpenFlow pipeline on Open vSwitch.

Layout: ``tables`` (the table numbers, registers and port numbers, OpenShift SDN's roles),
``flow`` (one flow as a value, rendered to ``ovs-ofctl`` text; cookies per object), the pure
renderers of the desired flows (``pipeline``, ``policyflows``, ``flowstate``), and the thin
layers that run the node's own ``ovsdb-server``/``ovs-vswitchd`` (``daemons``, ``ovsdb``),
apply flows in bundles (``ofctl``, ``flowsync``), build the underlay (``underlay*``), the
host's side (``hostnet``) and the pods (``ovspods``), and ``backend``: ``OvsDataPlane``,
registered as ``ovs``. ``OvsDataPlane`` is exported here, imported on first use only (a
module that needs ``tables`` alone does not load OVSDB and netlink).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from podnet.dataplane.ovs.backend import OvsDataPlane as OvsDataPlane


def __getattr__(name: str) -> object:
    if name == "OvsDataPlane":
        from podnet.dataplane.ovs.backend import OvsDataPlane

        return OvsDataPlane
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
