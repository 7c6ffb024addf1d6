"""Hand-built protobuf fields for tests of the API's protobuf bodies (what client-go and
kubectl send for typed objects): enough wire format to write a message field by field."""

from __future__ import annotations


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number: int, payload: bytes | str) -> bytes:
    """One length-delimited protobuf field (strings, bytes and messages)."""
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def vfield(number: int, value: int) -> bytes:
    """One varint protobuf field (ints, bools)."""
    return _varint(number << 3) + _varint(value)
