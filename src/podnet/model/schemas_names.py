"""Name rules shared by validation and selectors: DNS names, label keys and values.

Each ``*_problem`` function returns ``None`` for a good value, or a short sentence saying
what is wrong with it. Callers add the field path and the quoted value. This module has no
pydantic dependency so that ``selectors`` stays light.
"""

from __future__ import annotations

import json
import re

_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS1035_RE = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_QUALIFIED_RE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_IANA_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")

LABEL_MAX = 63
SUBDOMAIN_MAX = 253
IANA_MAX = 15

_LABEL_WHY = (
    "a DNS-1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character"
)
_SUBDOMAIN_WHY = (
    "a DNS-1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character"
)
_DNS1035_WHY = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
    "start with a letter, and end with an alphanumeric character"
)
_QUALIFIED_WHY = (
    "must consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)


def quote(value: object, limit: int = 80) -> str:
    """A value as it appears in an error message: JSON-quoted and cut to ``limit``."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def dns_label_problem(value: str) -> str | None:
    """What is wrong with ``value`` as a DNS-1123 label (a Namespace name), if anything."""
    if len(value) > LABEL_MAX:
        return f"must be no more than {LABEL_MAX} characters"
    return None if _LABEL_RE.fullmatch(value) else _LABEL_WHY


def dns_subdomain_problem(value: str) -> str | None:
    """What is wrong with ``value`` as a DNS-1123 subdomain (most object names)."""
    if len(value) > SUBDOMAIN_MAX:
        return f"must be no more than {SUBDOMAIN_MAX} characters"
    return None if _SUBDOMAIN_RE.fullmatch(value) else _SUBDOMAIN_WHY


def dns1035_label_problem(value: str) -> str | None:
    """What is wrong with ``value`` as a DNS-1035 label (a Service name), if anything."""
    if len(value) > LABEL_MAX:
        return f"must be no more than {LABEL_MAX} characters"
    return None if _DNS1035_RE.fullmatch(value) else _DNS1035_WHY


def qualified_name_problem(value: str) -> str | None:
    """What is wrong with ``value`` as a label key: ``[prefix/]name``, prefix a subdomain."""
    prefix, slash, name = value.rpartition("/")
    if slash:
        if not prefix:
            return "prefix part must be non-empty"
        why = dns_subdomain_problem(prefix)
        if why:
            return f"prefix part {why}"
    if not name:
        return "name part must be non-empty"
    if len(name) > LABEL_MAX:
        return f"name part must be no more than {LABEL_MAX} characters"
    return None if _QUALIFIED_RE.fullmatch(name) else f"name part {_QUALIFIED_WHY}"


def label_value_problem(value: str) -> str | None:
    """What is wrong with ``value`` as a label value (may be empty), if anything."""
    if len(value) > LABEL_MAX:
        return f"must be no more than {LABEL_MAX} characters"
    if not value or _QUALIFIED_RE.fullmatch(value):
        return None
    return f"a label value {_QUALIFIED_WHY}"


def iana_service_name_problem(value: str) -> str | None:
    """What is wrong with ``value`` as an IANA service name (a named port), if anything."""
    if not value or len(value) > IANA_MAX:
        return f"must be 1 to {IANA_MAX} characters"
    if not _IANA_RE.fullmatch(value) or "--" in value:
        return "must be lower case alphanumerics or '-', not starting, ending or doubling '-'"
    if not any(c.isalpha() for c in value):
        return "must contain at least one letter"
    return None


def mask_trailing_dash(prefix: str) -> str:
    """A ``generateName`` prefix made checkable as a name: a trailing '-' becomes 'a'."""
    return prefix[:-1] + "a" if prefix.endswith("-") else prefix
