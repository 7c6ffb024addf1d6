"""Applies the rendered ``PolicyTable`` (``podnet.dataplane.linux.policytable``) to the kernel.

Runs on the backend's node thread (``nft`` inherits the thread's namespace). The table
last applied is kept, so a change costs one ``nft -f`` transaction with only the
difference. At start, or after a failed transaction, the table is read back from the
kernel first (its set names say what they hold), so a restarted agent changes nothing
when the kernel already matches.
"""

from __future__ import annotations

import logging

from podnet.dataplane.interface import DataPlaneError
from podnet.dataplane.linux import nftables
from podnet.dataplane.linux.policyscript import parse_listing, transaction
from podnet.dataplane.linux.policyvalues import TABLE_KEY, PolicyTable

log = logging.getLogger(__name__)


class PolicyTableSync:
    """Keeps ``table inet podnet_policy`` equal to the last ``PolicyTable`` given."""

    def __init__(self) -> None:
        self._known = False  # whether _have reflects the kernel
        self._have: PolicyTable | None = None  # None: no table

    def sync(self, want: PolicyTable) -> bool:
        """Make the kernel's table equal ``want``; True when something changed."""
        if not self._known:
            self._have = read_table()
            self._known = True
        script = transaction(self._have, want)
        if not script:
            return False
        try:
            nftables.run(script)
        except DataPlaneError:
            self._known = False  # read the kernel again next time
            raise
        self._have = None if want.empty else want
        return True

    def forget(self) -> None:
        """Read the kernel again before the next change (after outside interference)."""
        self._known = False


def read_table() -> PolicyTable | None:
    """The policy table in the kernel (names, types, chains, rules), None when absent."""
    text = nftables.list_table(TABLE_KEY, terse=True)
    return None if text is None else parse_listing(text)
