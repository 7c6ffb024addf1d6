"""The ``ovs`` data plane: OpenShift SDN's br0 OpenFlow pipeline on Open vSwitch.

Layout: ``tables`` (the table numbers, registers and port numbers, OpenShift SDN's roles),
``flow`` (one flow as a value, rendered to ``ovs-ofctl`` text; cookies per object), the pure
renderers of the desired flows, and the thin layers that run the node's own
``ovsdb-server``/``ovs-vswitchd`` and apply flows in bundles.
"""
