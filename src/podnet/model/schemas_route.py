"""Route (route.openshift.io/v1): OpenShift's fields and rules, closed to unknown fields.

Fields, as OpenShift names them:

- ``spec.host``: a DNS-1123 subdomain (labels of at most 63 characters). Empty asks the
  master for one: ``<name>-<namespace>.<suffix>`` (``podnet master --route-suffix``;
  ``podnet.api.routehosts`` fills it in as the object is stored).
- ``spec.path``: empty or starting with ``/``, URL path characters only (no spaces,
  ``#``, ``?`` or control characters: the router puts it in HAProxy maps); none on
  passthrough routes.
- ``spec.to`` and ``spec.alternateBackends`` (at most 3): ``{kind: Service, name,
  weight 0..256}``; kind defaults to Service, weight to 100.
- ``spec.port.targetPort``: a port number or a service port name.
- ``spec.wildcardPolicy``: only ``None`` (the default): podnet's router serves no
  wildcard routes, so ``Subdomain`` is refused rather than stored and ignored.
- ``spec.tls``: ``termination`` edge (the default) | passthrough | reencrypt (OpenShift's
  capitalised spellings are lowered); ``certificate``, ``key``, ``caCertificate``,
  ``destinationCACertificate`` in PEM; ``insecureEdgeTerminationPolicy`` None | Allow |
  Redirect. Passthrough takes no certificate, key or CA and only None or Redirect;
  only reencrypt takes ``destinationCACertificate``; a certificate needs its key and the
  key must be the certificate's (``podnet.model.routetls``). Error messages never quote
  a key.
- ``status.ingress[]``: ``{host, routerName, wildcardPolicy, routerCanonicalHostname,
  conditions[{type: Admitted, status, reason, message, lastTransitionTime}]}``. The
  status is dropped on create (as OpenShift does: a new route is admitted by routers,
  not by its author) and written through the ``routes/status`` subresource.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, Field, PlainValidator, ValidationInfo, model_validator

from podnet.model.kinds import ROUTE
from podnet.model.routenames import host_problem
from podnet.model.routetls import certificates_problem, key_problem
from podnet.model.schemas_common import (
    FORBIDDEN,
    REQUIRED,
    TYPE_INVALID,
    Problem,
    Schema,
    Strict,
    context_old,
    fail,
    json_type,
    reject,
)
from podnet.model.schemas_names import (
    dns1035_label_problem,
    dns_label_problem,
    dns_subdomain_problem,
    quote,
)
from podnet.model.schemas_types import in_range, max_items, one_of

DEFAULT_WEIGHT = 100
MAX_ALTERNATE_BACKENDS = 3
MAX_PATH = 1024
TERMINATIONS = ("edge", "passthrough", "reencrypt")
# OpenShift's defaulting accepts these spellings and stores the lower-case ones.
_TERMINATION_SPELLINGS = {"Edge": "edge", "Passthrough": "passthrough", "Reencrypt": "reencrypt"}
# RFC 3986 path characters: unreserved, sub-delims, ":", "@", "/" and %-escapes.
_PATH_RE = re.compile(r"/(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/]|%[0-9A-Fa-f]{2})*")


def _host(value: str) -> str:
    why = host_problem(value) if value else None
    if why:
        fail(f"{quote(value)} is not a valid host: {why}")
    return value


def _path(value: str) -> str:
    if not value:
        return value
    if not value.startswith("/"):
        fail(f"{quote(value)} must start with /")
    if len(value) > MAX_PATH:
        fail(f"must be no more than {MAX_PATH} characters, got {len(value)}")
    if not _PATH_RE.fullmatch(value):
        fail(
            f"{quote(value)} is not a valid URL path: only letters, digits, "
            "-._~!$&'()*+,;=:@/ and %XX escapes are allowed (no spaces, # or ?)"
        )
    return value


def _service_name(value: str) -> str:
    why = dns1035_label_problem(value) if value else "Required value: the Service's name"
    if why:
        fail(f"{quote(value)} is not a valid Service name: {why}")
    return value


def _service_kind(value: str) -> str:
    if value != "Service":
        fail(f"{quote(value)}: must reference a Service (kind: Service)")
    return value


def _target_port(value: object) -> int | str:
    """A port number 1..65535, or the name of one of the Service's ports."""
    if isinstance(value, int) and not isinstance(value, bool):
        return in_range(1, 65535)(value)
    if isinstance(value, str):
        why = dns_label_problem(value) if value else "must not be empty"
        if why:
            fail(f"{quote(value)} is not a valid port name: {why}")
        return value
    fail(f"must be an integer or a string, got {json_type(value)}", TYPE_INVALID)


def _only_none(value: str) -> str:
    if value != "None":
        fail(
            f'Unsupported value: {quote(value)}: supported values: "None" '
            "(podnet's router serves no wildcard routes)",
            "FieldValueNotSupported",
        )
    return value


def _timestamp(value: str) -> str:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        fail(f"{quote(value)} is not an RFC 3339 time (e.g. 2024-01-02T03:04:05Z)")
    return value


def _named(value: str, what: str) -> str:
    why = dns_subdomain_problem(value)
    if why:
        fail(f"{quote(value)} is not a valid {what}: {why}")
    return value


Weight = Annotated[int, AfterValidator(in_range(0, 256))]
Termination = Annotated[str, AfterValidator(one_of(*TERMINATIONS))]
InsecurePolicy = Annotated[str, AfterValidator(one_of("None", "Allow", "Redirect"))]
WildcardPolicy = Annotated[str, AfterValidator(_only_none)]
Host = Annotated[str, AfterValidator(_host)]
SubdomainName = Annotated[str, AfterValidator(lambda v: _named(v, "router name"))]


class RouteTargetReference(Strict):
    kind: Annotated[str, AfterValidator(_service_kind)] = "Service"
    name: Annotated[str, AfterValidator(_service_name)]
    weight: Weight = DEFAULT_WEIGHT


class RoutePort(Strict):
    targetPort: Annotated[int | str, PlainValidator(_target_port)]


class TLSConfig(Strict):
    termination: Termination | None = None
    certificate: str | None = None
    key: str | None = Field(default=None, repr=False)  # a secret: never in a repr or log
    caCertificate: str | None = None
    destinationCACertificate: str | None = None
    insecureEdgeTerminationPolicy: InsecurePolicy | None = None

    @model_validator(mode="before")
    @classmethod
    def _spelling(cls, data: Any) -> Any:
        """OpenShift's defaulting: "Edge" is stored as "edge"."""
        termination = data.get("termination") if isinstance(data, Mapping) else None
        if isinstance(termination, str) and termination in _TERMINATION_SPELLINGS:
            return {**data, "termination": _TERMINATION_SPELLINGS[termination]}
        return data

    @model_validator(mode="after")
    def _rules(self) -> TLSConfig:
        if self.termination is None and not self.destinationCACertificate:
            self.termination = "edge"
        reject(self._problems())
        return self

    def _problems(self) -> Iterator[Problem]:
        if self.termination is None:
            why = "Required value: edge, passthrough or reencrypt"
            yield Problem(("termination",), why, REQUIRED)
        if self.termination == "passthrough":
            yield from self._passthrough_problems()
            return
        if self.destinationCACertificate and self.termination not in (None, "reencrypt"):
            why = f"{self.termination} termination does not support destination certificates"
            yield Problem(("destinationCACertificate",), why, FORBIDDEN)
        yield from self._pem_problems()

    def _passthrough_problems(self) -> Iterator[Problem]:
        for field in ("certificate", "key", "caCertificate", "destinationCACertificate"):
            if getattr(self, field):
                why = "passthrough termination does not support certificates or keys"
                yield Problem((field,), why, FORBIDDEN)
        if self.insecureEdgeTerminationPolicy == "Allow":
            why = (
                'Invalid value: "Allow": passthrough routes may only use None or Redirect '
                "(the router cannot serve their plain HTTP)"
            )
            yield Problem(("insecureEdgeTerminationPolicy",), why)

    def _pem_problems(self) -> Iterator[Problem]:
        for field in ("certificate", "caCertificate", "destinationCACertificate"):
            value = getattr(self, field)
            why = certificates_problem(value) if value else None
            if why:
                yield Problem((field,), why)
        if self.certificate and not self.key:
            yield Problem(("key",), "Required value: a certificate needs its private key", REQUIRED)
        if self.key and not self.certificate:
            why = "Required value: a key needs its certificate"
            yield Problem(("certificate",), why, REQUIRED)
        if self.caCertificate and not self.certificate:
            why = "Required value: a CA certificate goes with a certificate and key"
            yield Problem(("certificate",), why, REQUIRED)
        why = key_problem(self.key, self.certificate) if self.key else None
        if why:
            yield Problem(("key",), why)


class RouteSpec(Strict):
    host: Host = ""
    path: Annotated[str, AfterValidator(_path)] | None = None
    to: RouteTargetReference
    alternateBackends: (
        Annotated[list[RouteTargetReference], AfterValidator(max_items(MAX_ALTERNATE_BACKENDS))]
        | None
    ) = None
    port: RoutePort | None = None
    tls: TLSConfig | None = None
    wildcardPolicy: WildcardPolicy = "None"

    @model_validator(mode="after")
    def _no_path_on_passthrough(self) -> RouteSpec:
        if self.path and self.tls is not None and self.tls.termination == "passthrough":
            why = f"{quote(self.path)}: passthrough termination does not support paths"
            reject([Problem(("path",), why, FORBIDDEN)])
        return self


class RouteIngressCondition(Strict):
    type: Annotated[str, AfterValidator(one_of("Admitted"))]
    status: Annotated[str, AfterValidator(one_of("True", "False", "Unknown"))]
    reason: str | None = None
    message: str | None = None
    lastTransitionTime: Annotated[str, AfterValidator(_timestamp)] | None = None


class RouteIngress(Strict):
    host: Host | None = None
    routerName: SubdomainName
    wildcardPolicy: WildcardPolicy | None = None
    routerCanonicalHostname: Host | None = None
    conditions: list[RouteIngressCondition] | None = None


class RouteStatus(Strict):
    ingress: list[RouteIngress] | None = None


class RouteBody(Strict):
    spec: RouteSpec
    status: RouteStatus = RouteStatus()

    @model_validator(mode="before")
    @classmethod
    def _no_status_on_create(cls, data: Any, info: ValidationInfo) -> Any:
        """A new route starts unadmitted, whatever status its author wrote."""
        if isinstance(data, Mapping) and context_old(info) is None:
            return {k: v for k, v in data.items() if k != "status"}
        return data


SCHEMAS: dict[str, Schema] = {ROUTE.kind: Schema(RouteBody)}
