"""The CNI error codes the agent answers with, and the mapping of failures onto them.

A leaf module: the pod manager raises these codes and the CNI server reports them, and
neither has to import the other for it.

Codes (the spec reserves 100+ for plugins; 100 and 101 are the shim's):

- 102 ``ERR_IPAM``: no address could be allocated. IP exhaustion is reported with the IPAM
  message (``no IP addresses available in range set: <start>-<end>``). It is not code 11:
  the condition is not transient by itself (only a DEL on this node clears it), and
  runtimes retry sandbox creation anyway; STATUS reports the same condition as 50.
- 103 ``ERR_DATAPLANE``: the data plane could not wire or unwire the pod (also: ADD of an
  interface that already exists).
- 104 ``ERR_CHECK``: CHECK found the attachment missing or different from prevResult.
- 11 when the IPAM lock stays busy or a request overran ``REQUEST_TIMEOUT``; 50/51 from
  STATUS; 101 for a bug (logged).
"""

from __future__ import annotations

import logging

from podnet.cni.types import ERR_INTERNAL, ERR_TRY_AGAIN_LATER, CniError
from podnet.dataplane.interface import DataPlaneError
from podnet.ipam.config import IpamError
from podnet.ipam.reservations import IpamLockTimeout

log = logging.getLogger("podnet.agent.cni")

ERR_IPAM = 102
ERR_DATAPLANE = 103
ERR_CHECK = 104

REQUEST_TIMEOUT = 55.0  # seconds per CNI request: below the shims' 60 s, so they hear why


def as_cni_error(exc: Exception) -> CniError:
    """The CNI error for a failure of IPAM, the data plane, or a bug."""
    if isinstance(exc, CniError):
        return exc
    if isinstance(exc, TimeoutError):
        return CniError(ERR_TRY_AGAIN_LATER, "timed out", f"no answer in {REQUEST_TIMEOUT:.0f} s")
    if isinstance(exc, IpamLockTimeout):
        return CniError(ERR_TRY_AGAIN_LATER, "IPAM is busy", str(exc))
    if isinstance(exc, IpamError):
        return CniError(ERR_IPAM, str(exc), "address allocation failed")
    if isinstance(exc, DataPlaneError):
        return CniError(ERR_DATAPLANE, "data plane failure", str(exc))
    log.error("internal error handling a CNI request", exc_info=exc)
    return CniError(ERR_INTERNAL, "internal error in podnet agent", f"{type(exc).__name__}: {exc}")
