"""Giving the heap's free memory back to the kernel (glibc's ``malloc_trim``).

Python frees objects into the C heap, which keeps the pages: after a large burst (a
5,000-chain nft build, a full listing of Services and EndpointSlices compiled at once)
an agent would keep tens to hundreds of MB it no longer uses. The service proxy trims
after such bursts.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable
from typing import cast


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    return cast("Callable[[int], int] | None", trim)


def trim_heap() -> bool:
    """Give the heap's free memory back to the kernel; False where the C library has no
    ``malloc_trim`` (not glibc)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
