"""The protobuf envelope reader against messages encoded by Google's protobuf library."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from hypothesis import given, settings
from hypothesis import strategies as st

from podnet.api import protobuf
from podnet.model.errors import ApiError

F = descriptor_pb2.FieldDescriptorProto


def _message(file: Any, name: str, fields: list[tuple[str, int, int, str]]) -> None:
    msg = file.message_type.add(name=name)
    for fname, number, ftype, type_name in fields:
        label = F.LABEL_REPEATED if type_name.endswith("Entry") else F.LABEL_OPTIONAL
        spec = msg.field.add(name=fname, number=number, type=ftype, label=label)
        if type_name:
            spec.type_name = f".k8s.{type_name}"


def _classes() -> dict[str, Any]:
    """Namespace, ObjectMeta, Time and Unknown, declared with the k8s field numbers."""
    file = descriptor_pb2.FileDescriptorProto(name="k8s_test.proto", package="k8s")
    string, message = F.TYPE_STRING, F.TYPE_MESSAGE
    _message(file, "Time", [("seconds", 1, F.TYPE_INT64, ""), ("nanos", 2, F.TYPE_INT32, "")])
    entry = file.message_type.add(name="LabelsEntry")
    entry.field.add(name="key", number=1, type=string, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=string, label=F.LABEL_OPTIONAL)
    _message(
        file,
        "ObjectMeta",
        [
            ("name", 1, string, ""),
            ("generateName", 2, string, ""),
            ("resourceVersion", 6, string, ""),
            ("generation", 7, F.TYPE_INT64, ""),
            ("creationTimestamp", 8, message, "Time"),
            ("labels", 11, message, "LabelsEntry"),
        ],
    )
    _message(file, "Namespace", [("metadata", 1, message, "ObjectMeta")])
    _message(file, "TypeMeta", [("apiVersion", 1, string, ""), ("kind", 2, string, "")])
    _message(file, "Unknown", [("typeMeta", 1, message, "TypeMeta"), ("raw", 2, F.TYPE_BYTES, "")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    names = ("Namespace", "Unknown", "LabelsEntry")
    return {
        n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"k8s.{n}")) for n in names
    }


CLASSES = _classes()


def encode_namespace(name: str, labels: dict[str, str], seconds: int = 0) -> bytes:
    ns = CLASSES["Namespace"]()
    ns.metadata.name = name
    ns.metadata.creationTimestamp.seconds = seconds
    for key, value in labels.items():
        ns.metadata.labels.add(key=key, value=value)
    unknown = CLASSES["Unknown"]()
    unknown.typeMeta.apiVersion, unknown.typeMeta.kind = "v1", "Namespace"
    unknown.raw = ns.SerializeToString()
    return protobuf.MAGIC + unknown.SerializeToString()


def test_namespace_round_trip() -> None:
    body = encode_namespace("team-a", {"team": "a", "tier": ""}, seconds=1_700_000_000)
    obj = protobuf.decode_object(body)
    assert obj == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": "team-a",
            "labels": {"team": "a", "tier": ""},
            "creationTimestamp": "2023-11-14T22:13:20Z",
        },
    }


@settings(max_examples=300, derandomize=True)
@given(
    name=st.text(max_size=40),
    labels=st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=5),
)
def test_any_encoded_namespace_decodes_to_its_fields(name: str, labels: dict[str, str]) -> None:
    obj = protobuf.decode_object(encode_namespace(name, labels))
    meta = obj.get("metadata", {})  # an empty message is dropped, like JSON's omitempty
    assert meta.get("name", "") == name
    assert meta.get("labels", {}) == labels


@settings(max_examples=2000, derandomize=True)
@given(st.binary(max_size=200))
def test_garbage_is_a_4xx_never_a_crash(garbage: bytes) -> None:
    for body in (garbage, protobuf.MAGIC + garbage, encode_namespace("x", {})[:-1] + garbage):
        try:
            protobuf.decode_object(body)
        except ApiError as exc:
            assert exc.code in (400, 415)


@pytest.mark.parametrize(
    "body",
    [
        protobuf.MAGIC + b"\x0a\x80",  # length varint cut short
        protobuf.MAGIC + b"\x0a" + b"\xff" * 11,  # varint longer than 10 bytes
        protobuf.MAGIC + b"\x0b",  # wire type 3 (groups)
        protobuf.MAGIC + b"\x0a\x05abc",  # length past the end
    ],
)
def test_malformed_envelopes_are_400(body: bytes) -> None:
    with pytest.raises(ApiError) as caught:
        protobuf.decode_object(body)
    assert caught.value.code == 400


# Bodies captured from kubectl 1.32 (`create namespace capns`, `create service clusterip api
# --tcp=80:8080`) against a stub server: the real bytes, decoded independently of our encoders.
KUBECTL_NAMESPACE = bytes.fromhex(
    "6b3873000a0f0a02763112094e616d657370616365121d0a150a056361706e7312001a0022002a00"
    "32003800420012001a020a001a002200"
)
KUBECTL_SERVICE = bytes.fromhex(
    "6b3873000a0d0a02763112075365727669636512690a1f0a0361706912001a0022002a0032003800"
    "42005a0a0a03617070120361706912420a1b0a0738302d3830383012035443501850220708001090"
    "3f1a002800120a0a0361707012036170691a002209436c757374657249503a00420052005a006000"
    "68001a020a001a002200"
)


def test_real_kubectl_bodies() -> None:
    assert protobuf.decode_object(KUBECTL_NAMESPACE) == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "capns"},
    }
    service = protobuf.decode_object(KUBECTL_SERVICE)
    assert service["metadata"] == {"name": "api", "labels": {"app": "api"}}
    assert service["spec"] == {
        "ports": [{"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080}],
        "selector": {"app": "api"},
        "type": "ClusterIP",
    }
