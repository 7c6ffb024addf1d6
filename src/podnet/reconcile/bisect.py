"""Felix-style bisection: which keyed objects make the data plane refuse a batch.

The data plane applies a batch all or nothing, so one object it refuses (a rendering
``nft`` rejects) would keep every other change out. ``find_rejected`` takes the keys of
the batch's objects and ``accepts(left_out)``, which applies the batch without those
objects and says whether the data plane took it (a transient error propagates). It
assumes the whole batch was just refused and returns the keys to leave out, or None
when the batch is refused even with every object left out (the fault is not in the
objects). When it returns keys, its last ``accepts`` is the one that succeeded with
them left out, so that is the state left in the data plane; when it gives up, the data
plane holds whatever its last successful ``accepts`` applied (a subset of the batch).

Finding one bad object among ``n`` takes about log2(n) applies: the objects before it
are known to pass together, so the search halves the rest each time. ``b`` bad objects
take about ``b * log2(n)``. ``limit`` bounds the applies (then None: give up).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

Accepts = Callable[[frozenset[str]], Awaitable[bool]]
DEFAULT_LIMIT = 200


class _Budget:
    def __init__(self, accepts: Accepts, limit: int) -> None:
        self._accepts = accepts
        self.left = limit

    async def __call__(self, left_out: frozenset[str]) -> bool:
        if self.left <= 0:
            raise _OutOfBudget
        self.left -= 1
        return await self._accepts(left_out)


class _OutOfBudget(Exception):
    pass


async def find_rejected(
    keys: Sequence[str], accepts: Accepts, limit: int = DEFAULT_LIMIT
) -> frozenset[str] | None:
    """The keys whose objects the data plane refuses (see the module docstring)."""
    tries = _Budget(accepts, limit)
    try:
        return await _search(list(keys), tries)
    except _OutOfBudget:
        return None


async def _search(keys: list[str], accepts: _Budget) -> frozenset[str] | None:
    if not keys or not await accepts(frozenset(keys)):
        return None  # refused with no object at all: not theirs to answer for
    left_out: frozenset[str] = frozenset()
    rest = keys  # the objects after the last bad one, not yet known to pass
    while rest:
        bad = await _first_bad(rest, left_out, accepts)
        left_out, rest = left_out | {rest[bad]}, rest[bad + 1 :]
        if await accepts(left_out):
            return left_out
    return None  # refused again with the same objects out: a flaky refusal, not theirs


async def _first_bad(rest: list[str], left_out: frozenset[str], accepts: _Budget) -> int:
    """The index in ``rest`` of the first object whose addition gets the batch refused.

    Known on entry: the batch passes with all of ``rest`` left out too, and is refused
    with none of it left out."""
    passes, refused = 0, len(rest)  # rest[:passes] included passes; rest[:refused] not
    while refused - passes > 1:
        middle = (passes + refused) // 2
        if await accepts(left_out | frozenset(rest[middle:])):
            passes = middle
        else:
            refused = middle
    return refused - 1
