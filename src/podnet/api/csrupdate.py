"""What an update of a CertificateSigningRequest may change, per path (kube's strategy).

- the object itself: metadata only; the spec is fixed at create, the status is the
  subresources';
- ``/status`` (the signer): conditions other than Approved/Denied, and
  ``status.certificate`` once, on an Approved request only;
- ``/approval`` (``kubectl certificate approve|deny``): the Approved/Denied condition;
  a decision once made stays (it may not be removed or turned around).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from podnet.model import errors
from podnet.model.csr import APPROVED, DECISIONS, certificate_of, conditions, has_condition
from podnet.model.kinds import CERTIFICATE_SIGNING_REQUEST as CSR

Obj = dict[str, Any]


def _invalid(name: str, field: str, why: str) -> errors.ApiError:
    return errors.invalid(CSR.kind, name, [errors.FieldError(field, why)])


def _decisions(obj: Mapping[str, Any]) -> list[Obj]:
    return [dict(c) for c in conditions(obj) if c.get("type") in DECISIONS]


def _others(obj: Mapping[str, Any]) -> list[Obj]:
    return [dict(c) for c in conditions(obj) if c.get("type") not in DECISIONS]


def _stamped(found: list[Obj], now: str) -> list[Obj]:
    for cond in found:
        cond.setdefault("status", "True")
        cond.setdefault("lastUpdateTime", now)
        cond.setdefault("lastTransitionTime", now)
    return found


def _with_conditions(old: Obj, found: list[Obj]) -> Obj:
    merged = copy.deepcopy(old)
    status = merged.setdefault("status", {})
    if found:
        status["conditions"] = found
    else:
        status.pop("conditions", None)
    return merged


def merge_csr_update(old: Obj, new: Obj, subresource: str | None, now: str) -> Obj:
    """The object to store for an update of ``old`` with ``new`` through ``subresource``
    (``now``: the RFC 3339 time that new conditions are stamped with)."""
    name = str(old["metadata"].get("name", ""))
    if subresource is None:
        new["spec"] = copy.deepcopy(old.get("spec"))
        if "status" in old:
            new["status"] = copy.deepcopy(old["status"])
        else:
            new.pop("status", None)
        return new
    if subresource == "approval":
        before, after = _decisions(old), _decisions(new)
        kept = {(c.get("type"), c.get("status", "True")) for c in after}
        for cond in before:
            if (cond.get("type"), cond.get("status", "True")) not in kept:
                raise _invalid(
                    name, "status.conditions", f"a {cond.get('type')} condition may not be removed"
                )
        return _with_conditions(old, _stamped(after, now) + _others(old))
    if subresource == "status":
        merged = _with_conditions(old, _decisions(old) + _stamped(_others(new), now))
        was, given = certificate_of(old), certificate_of(new)
        if was is not None and given != was:
            raise _invalid(name, "status.certificate", "a certificate once issued may not change")
        if given is not None and was is None:
            if not has_condition(old, APPROVED) or has_condition(old, "Denied"):
                raise _invalid(name, "status.certificate", "may only be set on an Approved request")
            merged["status"]["certificate"] = given
        return merged
    raise errors.ApiError(f"subresource {subresource!r} not found", 404, "NotFound")
