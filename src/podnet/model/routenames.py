"""Route host names: the rule a host obeys, and the host OpenShift gives a route without one.

No pydantic here, so the registry and the CLI can use it without loading the schemas.
"""

from __future__ import annotations

from podnet.model.schemas_names import LABEL_MAX, dns_subdomain_problem

# OpenShift 3's default routing subdomain (``routingConfig.subdomain``).
DEFAULT_ROUTE_SUFFIX = "router.default.svc.cluster.local"


def host_problem(value: str) -> str | None:
    """What is wrong with ``value`` as a route host (a DNS-1123 subdomain whose labels
    are at most 63 characters), if anything."""
    why = dns_subdomain_problem(value)
    if why:
        return why
    if any(len(label) > LABEL_MAX for label in value.split(".")):
        return f"each label must be no more than {LABEL_MAX} characters"
    return None


def suffix_problem(suffix: str) -> str | None:
    """What is wrong with ``suffix`` as a routing subdomain, if anything."""
    return host_problem(suffix) if suffix else "must not be empty"


def generated_host(name: str, namespace: str, suffix: str) -> str:
    """OpenShift's host for a route without one: ``<name>-<namespace>.<suffix>`` (dots in
    the name become dashes, so the first label is the route's own)."""
    return f"{name.replace('.', '-')}-{namespace}.{suffix}"
