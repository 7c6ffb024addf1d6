"""The datapath's flow cache after a policy change: dropped, so no old verdict outlives it.

``ovs-vswitchd`` caches each verdict of its OpenFlow tables in the datapath as a flow (a
"megaflow": the match it had to look at, the actions it chose). A packet that hits one is
never looked at by the tables; only packets that miss it are, and those see the tables as
they are now. When the tables change, the revalidator threads re-translate the cached
flows, but later and in their own time: one dump pass is a few milliseconds on an idle
node and much longer on a loaded one, and a pass that was running when the bundle landed
may keep the old actions until the next one (``revalidator/wait`` waits for the end of
that pass, which is why it is not a barrier). Until then a cached "drop" of the old policy
still drops. A flow whose match is narrower than the new tables need (for instance one
with ``tp_dst`` from an earlier port rule) is kept and only its actions rewritten, so it is
exactly such flows that lag. That fits the intermittent NetworkPolicy e2e failure on
ovs (x/a's UDP/81 still blocked, only towards pods the previous case had denied, right
after every node's tables held the egress rule that allowed it).

So after a sync that changed the verdicts (a policy or VNID change), ``forget_verdicts``
removes every cached flow (``revalidator/purge``: synchronous, in ``ovs-vswitchd``'s main
thread, which is also the one that forwards the userspace datapath's packets; the
statistics are pushed to the OpenFlow rules first). The next packet of each flow is
translated by the new tables. Conntrack is left alone: established connections keep
going as on the linux plane.
"""

from __future__ import annotations

from typing import Final, Protocol

PURGE: Final = "revalidator/purge"


class Switch(Protocol):
    """Anything that reaches ``ovs-vswitchd``'s control socket (``OfctlRunner``)."""

    async def appctl(self, command: str, *args: str) -> str:
        """Run one unixctl command; its reply."""


def verdicts_changed(mode: str, same_rules: bool) -> bool:
    """Whether a flow sync of ``mode`` (``FlowSync``'s ``none``, ``bundle`` or
    ``replace``) may have changed what the switch decides for a packet: a bundle always
    did; a whole-table replace did unless it re-sent the rules already in force (the
    periodic resync, which repairs drift only)."""
    if mode == "bundle":
        return True
    return mode == "replace" and not same_rules


async def forget_verdicts(switch: Switch) -> None:
    """Remove every flow cached in ``switch``'s datapath (see the module)."""
    await switch.appctl(PURGE)
