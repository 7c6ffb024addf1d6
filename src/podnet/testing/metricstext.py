"""Reading a Prometheus text exposition in tests: one sample's value by name and labels."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def sample(text: str | bytes, name: str, **labels: str) -> float | None:
    """The value of the sample ``name`` whose labels include ``labels`` (None: absent;
    several matches: their sum)."""
    if isinstance(text, bytes):
        text = text.decode()
    found = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    ]
    return sum(found) if found else None


def names(text: str | bytes) -> set[str]:
    """Every sample name in ``text``."""
    if isinstance(text, bytes):
        text = text.decode()
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}
