"""The ``linux`` data plane: Linux bridge ``br0``, VXLAN or host-gw routes, nftables.

``LinuxDataPlane`` works in the network namespace of the thread that constructs it.
"""

from __future__ import annotations

from podnet.dataplane.linux.backend import LinuxDataPlane

__all__ = ["LinuxDataPlane"]
