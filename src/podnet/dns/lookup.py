"""Answering a question from the zone index (pure: no wire format, no I/O).

``resolve`` follows the rules of an authoritative server for the cluster zone:

- records of the asked type at the name: the answer (ANY: every record there); SRV
  answers carry the A/AAAA records of their targets in the additional section;
- a CNAME at the name (an ExternalName service): the CNAME, then the same question for
  its target, chased while the target is in one of our zones (a chain is cut after
  ``MAX_CHASE`` links: a loop answers SERVFAIL). A target outside them is handed back as
  ``external`` for the server to ask upstream, as CoreDNS does, because glibc does not
  follow a bare CNAME to a name it was not given an address for;
- no records of that type: NODATA when the name exists (it owns other records, or has
  descendants), NXDOMAIN when it does not; both with the zone's SOA in authority, so
  resolvers cache the negative answer for the SOA minimum.

A name outside every zone the index is authoritative for is not answered here (None),
unless the index holds records for it (the PTR of an endpoint outside the cluster
networks): then the server forwards it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from podnet.dns.names import normalize
from podnet.dns.records import AAAA, CNAME, SRV, A, Record
from podnet.dns.zone import ZoneIndex

NOERROR, SERVFAIL, NXDOMAIN = 0, 2, 3
ANY = 255
MAX_CHASE = 8


@dataclass
class Resolution:
    """What to answer: the rcode and the three sections, and for caching the names the
    answer was read from (a change to any of them invalidates it)."""

    rcode: int = NOERROR
    answers: list[Record] = field(default_factory=list)
    authority: list[Record] = field(default_factory=list)
    additional: list[Record] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    external: str | None = None  # an out-of-zone CNAME target, to be resolved upstream
    authoritative: bool = True


def _of_type(index: ZoneIndex, name: str, qtype: int) -> list[Record]:
    return sorted(
        (r for r in index.records(name) if qtype in (ANY, r.rtype)),
        key=lambda r: (r.rtype, r.data),
    )


def resolve(index: ZoneIndex, qname: str, qtype: int) -> Resolution | None:
    """The answer to ``qname``/``qtype`` from ``index``, or None when it is not ours."""
    name = normalize(qname)
    if index.apex_of(name) is None:
        found = _of_type(index, name, qtype)
        return Resolution(answers=found, names={name}, authoritative=False) if found else None
    result = Resolution()
    for _ in range(MAX_CHASE):
        result.names.add(name)
        found = _of_type(index, name, qtype)
        if found:
            result.answers.extend(found)
            _add_targets(index, found, result)
            return result
        cname = _of_type(index, name, CNAME)
        if not cname:
            return _negative(index, name, result)
        result.answers.append(cname[0])
        name = str(cname[0].data[0])
        if index.apex_of(name) is None:
            result.external = name
            return result
    result.rcode = SERVFAIL
    result.answers.clear()
    return result


def _negative(index: ZoneIndex, name: str, result: Resolution) -> Resolution:
    """NODATA or NXDOMAIN for ``name``, with its zone's SOA."""
    result.rcode = NOERROR if index.exists(name) else NXDOMAIN
    apex = index.apex_of(name)
    if apex is not None:
        result.authority.append(index.soa(apex))
    return result


def _add_targets(index: ZoneIndex, answers: list[Record], result: Resolution) -> None:
    """The addresses of SRV targets, in the additional section."""
    targets = {str(r.data[3]): None for r in answers if r.rtype == SRV}
    result.names.update(targets)
    for target in targets:
        result.additional.extend(_of_type(index, target, A))
        result.additional.extend(_of_type(index, target, AAAA))
