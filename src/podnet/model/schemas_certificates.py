"""certificates.k8s.io/v1 CertificateSigningRequest: how a host asks for a client
certificate of the API (TLS bootstrap).

The shape is Kubernetes'. ``spec.request`` must be a PKCS#10 request whose self-signature
verifies; ``spec.signerName`` one of the signers podnet serves (``podnet.model.csr``);
``spec.usages`` those of a client certificate. ``spec.username``, ``groups``, ``uid`` and
``extra`` are accepted but always replaced by the server with the requester's identity
(``podnet.api.csrrestriction``); the spec never changes after create
(``podnet.api.csrupdate``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, model_validator

from podnet.model.csr import (
    DECISIONS,
    FAILED,
    KNOWN_USAGES,
    MIN_EXPIRATION_SECONDS,
    SIGNERS,
    CsrError,
    parse_request,
    usages_problem,
)
from podnet.model.kinds import CERTIFICATE_SIGNING_REQUEST
from podnet.model.schemas_common import NOT_SUPPORTED, Open, Schema, Strict, fail
from podnet.model.schemas_coordination import MicroTime
from podnet.model.schemas_types import in_range, max_items, one_of

MAX_INT32 = (1 << 31) - 1


def _request(value: str) -> str:
    try:
        parse_request(value)
    except CsrError as exc:
        fail(f"the certificate request {exc}")
    return value


def _signer(value: str) -> str:
    if value not in SIGNERS:
        known = ", ".join(f'"{s}"' for s in SIGNERS)
        fail(f'unknown signer "{value[:256]}": this cluster signs only {known}', NOT_SUPPORTED)
    return value


Usage = Annotated[str, AfterValidator(one_of(*KNOWN_USAGES))]
Expiration = Annotated[int, AfterValidator(in_range(MIN_EXPIRATION_SECONDS, MAX_INT32))]
ConditionType = Annotated[str, AfterValidator(one_of(*sorted(DECISIONS | {FAILED})))]


class CsrSpec(Open):
    request: Annotated[str, AfterValidator(_request)]
    signerName: Annotated[str, AfterValidator(_signer)]
    usages: Annotated[list[Usage], AfterValidator(max_items(len(KNOWN_USAGES)))]
    expirationSeconds: Expiration | None = None
    # Set by the server from the requester, whatever the body says.
    username: str | None = None
    uid: str | None = None
    groups: list[str] | None = None
    extra: dict[str, list[str]] | None = None

    @model_validator(mode="after")
    def _usages(self) -> CsrSpec:
        problem = usages_problem(self.signerName, self.usages)
        if problem:
            fail(problem)
        return self


class CsrCondition(Open):
    type: ConditionType
    status: Annotated[str, AfterValidator(one_of("True", "False", "Unknown"))] = "True"
    reason: str | None = None
    message: str | None = None
    lastUpdateTime: MicroTime | None = None
    lastTransitionTime: MicroTime | None = None


class CsrStatus(Open):
    conditions: Annotated[list[CsrCondition], AfterValidator(max_items(16))] | None = None
    certificate: str | None = None

    @model_validator(mode="after")
    def _one_decision(self) -> CsrStatus:
        decided = {c.type for c in self.conditions or [] if c.type in DECISIONS}
        if len(decided) > 1:
            fail("a request may be Approved or Denied, not both")
        return self


class CsrBody(Strict):
    spec: CsrSpec
    status: CsrStatus | None = None


SCHEMAS: dict[str, Schema] = {CERTIFICATE_SIGNING_REQUEST.kind: Schema(CsrBody)}
