"""Decoding Kubernetes' protobuf request bodies (``application/vnd.kubernetes.protobuf``).

kubectl's typed commands (``kubectl create namespace``, ``kubectl auth can-i``) send their
object in Kubernetes' protobuf envelope rather than JSON. The envelope is the 4-byte magic
``k8s\\0`` followed by a ``runtime.Unknown`` message:

    message Unknown { TypeMeta typeMeta = 1; bytes raw = 2;
                      string contentEncoding = 3; string contentType = 4; }
    message TypeMeta { string apiVersion = 1; string kind = 2; }

``raw`` is the object's own message (``v1.Namespace`` ...). This module is a small
wire-format reader plus field tables for the kinds those commands send, taken from
k8s.io/api and k8s.io/apimachinery ``generated.proto``. It turns a body into the same JSON
object the client would have sent, so everything after it (validation, admission) is
shared with JSON. Generated Go code writes every scalar even when empty; like the JSON
encoding's ``omitempty``, empty values are dropped. Anything unexpected is a 400; a kind
without a table is a 415 that names it.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, Union

from podnet.model import errors

MAGIC = b"k8s\x00"
CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
MAX_NESTING = 16

# A field: (json name, type). A type is a scalar name, a message table, or a tuple
# ("repeated", type) / ("map",) for map<string,string>.
FieldType = Union[str, "Message", tuple[Any, ...]]
Message = dict[int, tuple[str, FieldType]]

INT_OR_STRING: Message = {1: ("type", "int64"), 2: ("intVal", "int32"), 3: ("strVal", "string")}
TIME: Message = {1: ("seconds", "int64"), 2: ("nanos", "int32")}
OWNER_REFERENCE: Message = {
    1: ("kind", "string"),
    3: ("name", "string"),
    4: ("uid", "string"),
    5: ("apiVersion", "string"),
    6: ("controller", "bool"),
    7: ("blockOwnerDeletion", "bool"),
}
OBJECT_META: Message = {
    1: ("name", "string"),
    2: ("generateName", "string"),
    3: ("namespace", "string"),
    4: ("selfLink", "string"),
    5: ("uid", "string"),
    6: ("resourceVersion", "string"),
    7: ("generation", "int64"),
    8: ("creationTimestamp", "time"),
    9: ("deletionTimestamp", "time"),
    10: ("deletionGracePeriodSeconds", "int64"),
    11: ("labels", ("map",)),
    12: ("annotations", ("map",)),
    13: ("ownerReferences", ("repeated", OWNER_REFERENCE)),
    14: ("finalizers", ("repeated", "string")),
    17: ("managedFields", "skip"),  # server-side apply bookkeeping, not used by podnet
}
NAMESPACE: Message = {
    1: ("metadata", OBJECT_META),
    2: ("spec", {1: ("finalizers", ("repeated", "string"))}),
    3: ("status", {1: ("phase", "string")}),
}
SERVICE_PORT: Message = {
    1: ("name", "string"),
    2: ("protocol", "string"),
    3: ("port", "int32"),
    4: ("targetPort", "intorstring"),
    5: ("nodePort", "int32"),
    6: ("appProtocol", "string"),
}
SERVICE: Message = {
    1: ("metadata", OBJECT_META),
    2: (
        "spec",
        {
            1: ("ports", ("repeated", SERVICE_PORT)),
            2: ("selector", ("map",)),
            3: ("clusterIP", "string"),
            4: ("type", "string"),
            5: ("externalIPs", ("repeated", "string")),
            7: ("sessionAffinity", "string"),
            8: ("loadBalancerIP", "string"),
            9: ("loadBalancerSourceRanges", ("repeated", "string")),
            10: ("externalName", "string"),
            11: ("externalTrafficPolicy", "string"),
            12: ("healthCheckNodePort", "int32"),
            13: ("publishNotReadyAddresses", "bool"),
            14: ("sessionAffinityConfig", {1: ("clientIP", {1: ("timeoutSeconds", "int32")})}),
            17: ("ipFamilyPolicy", "string"),
            18: ("clusterIPs", ("repeated", "string")),
            19: ("ipFamilies", ("repeated", "string")),
            20: ("allocateLoadBalancerNodePorts", "bool"),
            21: ("loadBalancerClass", "string"),
            22: ("internalTrafficPolicy", "string"),
            23: ("trafficDistribution", "string"),
        },
    ),
}
RESOURCE_ATTRIBUTES: Message = {
    1: ("namespace", "string"),
    2: ("verb", "string"),
    3: ("group", "string"),
    4: ("version", "string"),
    5: ("resource", "string"),
    6: ("subresource", "string"),
    7: ("name", "string"),
}
SELF_SUBJECT_ACCESS_REVIEW: Message = {
    1: ("metadata", OBJECT_META),
    2: (
        "spec",
        {
            1: ("resourceAttributes", RESOURCE_ATTRIBUTES),
            2: ("nonResourceAttributes", {1: ("path", "string"), 2: ("verb", "string")}),
        },
    ),
}
# certificates.k8s.io/v1 (``kubectl certificate approve`` sends the whole request).
CSR_CONDITION: Message = {
    1: ("type", "string"),
    6: ("status", "string"),
    2: ("reason", "string"),
    3: ("message", "string"),
    4: ("lastUpdateTime", "time"),
    5: ("lastTransitionTime", "time"),
}
CERTIFICATE_SIGNING_REQUEST: Message = {
    1: ("metadata", OBJECT_META),
    2: (
        "spec",
        {
            1: ("request", "base64"),
            7: ("signerName", "string"),
            8: ("expirationSeconds", "int32"),
            5: ("usages", ("repeated", "string")),
            2: ("username", "string"),
            3: ("uid", "string"),
            4: ("groups", ("repeated", "string")),
            6: ("extra", "skip"),
        },
    ),
    3: (
        "status",
        {1: ("conditions", ("repeated", CSR_CONDITION)), 2: ("certificate", "base64")},
    ),
}
# (apiVersion, kind) -> the message of ``raw``.
KINDS: dict[tuple[str, str], Message] = {
    ("v1", "Namespace"): NAMESPACE,
    ("v1", "Service"): SERVICE,
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): SELF_SUBJECT_ACCESS_REVIEW,
    ("certificates.k8s.io/v1", "CertificateSigningRequest"): CERTIFICATE_SIGNING_REQUEST,
}
UNKNOWN: Message = {
    1: ("typeMeta", {1: ("apiVersion", "string"), 2: ("kind", "string")}),
    2: ("raw", "bytes"),
    3: ("contentEncoding", "string"),
    4: ("contentType", "string"),
}


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def decode_object(body: bytes) -> dict[str, Any]:
    """The JSON form of a protobuf-encoded object; 400 if malformed, 415 if unknown kind."""
    if not body.startswith(MAGIC):
        raise errors.bad_request("the protobuf body does not start with the k8s\\0 magic")
    try:
        envelope = decode_message(body[len(MAGIC) :], UNKNOWN)
    except WireError as exc:
        raise errors.bad_request(f"the protobuf envelope is malformed: {exc}") from exc
    type_meta = envelope.get("typeMeta") or {}
    api_version, kind = type_meta.get("apiVersion", ""), type_meta.get("kind", "")
    if envelope.get("contentEncoding"):
        raise errors.unsupported_media_type("protobuf content encodings are not supported")
    table = KINDS.get((api_version, kind))
    if table is None:
        known = ", ".join(f"{k} ({v})" for v, k in KINDS)
        raise errors.unsupported_media_type(
            f"protobuf is not supported for {kind or '?'} ({api_version or '?'}); "
            f"send JSON instead (protobuf is accepted for: {known})"
        )
    try:
        obj = decode_message(envelope.get("raw", b""), table)
    except WireError as exc:
        raise errors.bad_request(f"the protobuf {kind} is malformed: {exc}") from exc
    return {"apiVersion": api_version, "kind": kind, **obj}


def decode_message(data: bytes, table: Message, depth: int = 0) -> dict[str, Any]:
    """Decode one message with ``table``; unknown fields are skipped, as protobuf does."""
    if depth > MAX_NESTING:
        raise WireError("messages nested too deeply")
    out: dict[str, Any] = {}
    for number, wire_type, value in iter_fields(data):
        if number not in table:
            continue
        name, ftype = table[number]
        if isinstance(ftype, tuple):
            _add_composite(out, name, ftype, wire_type, value, depth)
            continue
        decoded = _scalar_or_message(ftype, wire_type, value, depth)
        if decoded not in (None, "", 0, False, {}, b"") or ftype == "bytes":
            out[name] = decoded
        else:
            out.pop(name, None)
    return out


def _add_composite(
    out: dict[str, Any], name: str, ftype: tuple[Any, ...], wire: int, value: Any, depth: int
) -> None:
    if ftype[0] == "map":
        entry = decode_message(_need_bytes(wire, value), {1: ("k", "str"), 2: ("v", "str")}, depth)
        out.setdefault(name, {})[entry.get("k", "")] = entry.get("v", "")
        return
    item = _scalar_or_message(ftype[1], wire, value, depth)
    out.setdefault(name, []).append(item if item is not None else {})


def _scalar_or_message(ftype: FieldType, wire: int, value: Any, depth: int) -> Any:
    if isinstance(ftype, dict):
        return decode_message(_need_bytes(wire, value), ftype, depth + 1)
    if ftype == "skip":
        return None
    if ftype in ("string", "str"):
        try:
            return _need_bytes(wire, value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WireError("a string field is not UTF-8") from exc
    if ftype == "bytes":
        return _need_bytes(wire, value)
    if ftype == "base64":  # bytes, as JSON spells them
        return base64.b64encode(_need_bytes(wire, value)).decode("ascii")
    if ftype == "intorstring":  # {type: 0 int | 1 string, intVal, strVal}
        both = decode_message(_need_bytes(wire, value), INT_OR_STRING, depth + 1)
        return both.get("strVal", "") if both.get("type") == 1 else both.get("intVal", 0)
    if ftype == "time":
        seconds = decode_message(_need_bytes(wire, value), TIME, depth + 1).get("seconds", 0)
        return _rfc3339(seconds) if seconds else None
    if wire != 0:
        raise WireError(f"a {ftype} field has wire type {wire}")
    if ftype == "bool":
        return bool(value)
    return value - (1 << 64) if value >= 1 << 63 else value  # int64/int32: two's complement


def _rfc3339(seconds: int) -> str:
    try:
        return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError) as exc:
        raise WireError(f"timestamp {seconds} is out of range") from exc


def _need_bytes(wire: int, value: Any) -> bytes:
    if wire != 2:
        raise WireError(f"expected a length-delimited field, got wire type {wire}")
    return bytes(value)


def iter_fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of each field; value is an int or a memoryview."""
    view, pos = memoryview(data), 0
    while pos < len(view):
        key, pos = read_varint(view, pos)
        number, wire = key >> 3, key & 7
        value: int | memoryview
        if number == 0:
            raise WireError("field number 0")
        if wire == 0:
            value, pos = read_varint(view, pos)
        elif wire == 2:
            length, pos = read_varint(view, pos)
            if length > len(view) - pos:
                raise WireError("a length runs past the end of the message")
            value, pos = view[pos : pos + length], pos + length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if size > len(view) - pos:
                raise WireError("a fixed-width field runs past the end of the message")
            value, pos = int.from_bytes(view[pos : pos + size], "little"), pos + size
        else:
            raise WireError(f"unsupported wire type {wire}")
        yield number, wire, value


def read_varint(view: memoryview, pos: int) -> tuple[int, int]:
    """A base-128 varint at ``pos`` (at most 10 bytes), and the position after it."""
    result = 0
    for shift in range(0, 70, 7):
        if pos >= len(view):
            raise WireError("a varint runs past the end of the message")
        byte = view[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if result >= 1 << 64:
                raise WireError("a varint is larger than 64 bits")
            return result, pos
    raise WireError("a varint is longer than 10 bytes")
