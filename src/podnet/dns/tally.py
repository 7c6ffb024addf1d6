"""What the cluster DNS answered, counted in plain integers (no lock, no registry call per
query) and read at scrape time (``podnet.dns.metrics``).

One flat list of counters, one cell per (answered from the answer cache or not, query
type, response code): a query costs one list increment, and the UDP fast path (a cache
hit, never parsed) finds its cell in the cache next to the answer (``AnswerCache.cells``).
Types and codes come from fixed lists (``TYPES``, ``RCODES``; the rest is ``other``), so
no client can grow the series count, whatever names it asks for.
"""

from __future__ import annotations

TYPES = ("A", "AAAA", "CNAME", "MX", "NS", "PTR", "SOA", "SRV", "TXT", "ANY", "other")
_TYPE_CODES = (1, 28, 5, 15, 2, 12, 6, 33, 16, 255)
TYPE_INDEX = {code: i for i, code in enumerate(_TYPE_CODES)}
OTHER_TYPE = len(TYPES) - 1
# rcodes 0-5 by value, then any other code, then "none": nothing was sent back
RCODES = ("NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED", "other", "none")
OTHER_RCODE, NO_ANSWER = 6, 7
CELLS = 2 * len(TYPES) * len(RCODES)
CACHED = len(TYPES) * len(RCODES)  # offset of the cells of answers from the cache


def cell(qtype: int | None, answer: bytes | None, cached: bool = False) -> int:
    """The cell of a query of ``qtype`` (None: unparsable) answered ``answer`` (the
    whole message, or None when nothing was sent)."""
    kind = OTHER_TYPE if qtype is None else TYPE_INDEX.get(qtype, OTHER_TYPE)
    if answer is None or len(answer) < 4:
        code = NO_ANSWER
    else:
        code = answer[3] & 0x0F
        code = code if code < OTHER_RCODE else OTHER_RCODE
    return (CACHED if cached else 0) + kind * len(RCODES) + code


class Tally:
    """The counters: ``cells[cell(...)] += 1`` per query."""

    def __init__(self) -> None:
        self.cells = [0] * CELLS

    def count(self, qtype: int | None, answer: bytes | None) -> None:
        """One query answered without the cache."""
        self.cells[cell(qtype, answer)] += 1

    def _totals(self) -> tuple[list[int], list[int], list[int]]:
        """Sums by type, by rcode, and by (not cached, cached)."""
        kinds, codes, cached = [0] * len(TYPES), [0] * len(RCODES), [0, 0]
        for index, value in enumerate(self.cells):
            if value:
                hit, rest = divmod(index, CACHED)
                kind, code = divmod(rest, len(RCODES))
                kinds[kind] += value
                codes[code] += value
                cached[hit] += value
        return kinds, codes, cached

    def requests(self) -> dict[str, int]:
        """Queries by type."""
        return dict(zip(TYPES, self._totals()[0], strict=True))

    def responses(self) -> dict[str, int]:
        """Answers sent, by response code (``none`` left out)."""
        return dict(zip(RCODES[:NO_ANSWER], self._totals()[1][:NO_ANSWER], strict=True))

    def cache(self) -> tuple[int, int]:
        """(hits, misses): queries answered from the answer cache, and the others."""
        misses, hits = self._totals()[2]
        return hits, misses
