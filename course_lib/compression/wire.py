"""Lecture 7: The wire format of one payload: a checked header, the coded body, a checksum.

::

    b"CLGC" | version (1 byte) | header length L (4 bytes) | header (L bytes of JSON) |
    CRC32 of everything before it (4) | body (coded parts) | CRC32 of the body (4)

The header names the compressor, the original shape and dtype, the codec, each part's name,
dtype and length, and the body's coded and raw sizes. A receiver checks, in order: the magic,
the version, the header's CRC32, that every announced byte arrived, the body's CRC32, the codec,
the raw size and the parts' sizes; any failure raises :class:`PayloadError` saying which, so a
bit flipped on the wire or a truncated message is never decoded into a wrong gradient.
Frames delimit themselves, so several can be concatenated in one message (:func:`pack_many`).
"""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np

from course_lib.compression.base import FLOAT_DTYPES, Payload, PayloadError
from course_lib.compression.codecs import CODECS, Codec

__all__ = ["MAGIC", "pack", "pack_many", "unpack", "unpack_many"]

MAGIC = b"CLGC"  # course_lib gradient, compressed
VERSION = 1
_PREFIX = struct.Struct("<4sBI")  # magic, version, header length
_CRC = struct.Struct("<I")
_PART_DTYPES = ("int8", "uint8", "int16", "uint32", "int32", "float16", "float32", "float64")
_DECODERS: dict[str, Codec] = {}


def pack(payload: Payload, codec: Codec | None = None) -> bytes:
    """Return ``payload`` as one frame, its parts' bytes coded with ``codec`` (default: none)."""
    codec = codec or Codec()
    raw = b"".join(np.ascontiguousarray(p).tobytes() for p in payload.parts.values())
    body = codec.encode(raw) if codec.name != "none" else raw
    header = {
        "kind": payload.kind,
        "shape": list(payload.shape),
        "dtype": payload.dtype,
        "codec": codec.name,
        "parts": [[k, str(v.dtype), int(v.size)] for k, v in payload.parts.items()],
        "raw": len(raw),
        "body": len(body),
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    head = _PREFIX.pack(MAGIC, VERSION, len(text)) + text
    return b"".join((head, _CRC.pack(zlib.crc32(head)), body, _CRC.pack(zlib.crc32(body))))


def _decoder(name: str) -> Codec:
    if name not in CODECS:
        raise PayloadError(f"payload was coded with {name!r}, a codec this kit does not know")
    if name not in _DECODERS:
        _DECODERS[name] = CODECS[name]()
    return _DECODERS[name]


def _header(buf: memoryview, offset: int) -> tuple[dict, int]:
    """Return the checked header of the frame at ``offset`` and where its body starts."""
    have = len(buf) - offset
    if have < _PREFIX.size:
        raise PayloadError(
            f"payload truncated: {have} bytes, fewer than the {_PREFIX.size}-byte prefix"
        )
    magic, version, length = _PREFIX.unpack_from(buf, offset)
    if magic != MAGIC:
        raise PayloadError(
            f"not a gradient payload: it starts with {bytes(magic)!r} instead of {MAGIC!r} "
            "(corrupt, or read from the wrong offset)"
        )
    if version != VERSION:
        raise PayloadError(
            f"payload format version {version}, this kit reads {VERSION}: update both"
        )
    end = offset + _PREFIX.size + length
    if len(buf) < end + _CRC.size:
        raise PayloadError(f"payload truncated inside its header ({have} bytes arrived)")
    (crc,) = _CRC.unpack_from(buf, end)
    if crc != zlib.crc32(buf[offset:end]):
        raise PayloadError("payload header is corrupt (CRC32 mismatch): it changed on the way")
    try:
        header = json.loads(bytes(buf[offset + _PREFIX.size : end]))
        header["kind"], header["shape"], header["codec"], header["body"]  # noqa: B018 - present?
    except (ValueError, KeyError, TypeError) as exc:
        raise PayloadError(f"payload header is not a valid header ({exc})") from None
    return header, end + _CRC.size


def _check_parts(header: dict) -> list[tuple[str, np.dtype, int]]:
    try:
        parts = [(name, np.dtype(dt), int(n)) for name, dt, n in header["parts"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise PayloadError(f"payload header lists unreadable parts ({exc})") from None
    if any(dt.name not in _PART_DTYPES or n < 0 for _, dt, n in parts):
        raise PayloadError(f"payload header lists parts this kit cannot read: {header['parts']}")
    if header["dtype"] not in FLOAT_DTYPES:
        raise PayloadError(f"payload claims a tensor of dtype {header['dtype']!r}")
    if sum(dt.itemsize * n for _, dt, n in parts) != header["raw"]:
        raise PayloadError(
            f"payload parts {header['parts']} do not add up to {header['raw']} bytes"
        )
    return parts


def unpack(
    buf: bytes | bytearray | memoryview | np.ndarray, offset: int = 0
) -> tuple[Payload, int]:
    """Return the payload of the frame at ``offset`` and the offset just past it; check everything."""
    view = memoryview(buf).cast("B")
    header, start = _header(view, offset)
    parts = _check_parts(header)
    end = start + header["body"]
    if len(view) < end + _CRC.size:
        raise PayloadError(
            f"payload truncated: its header announces {end + _CRC.size - offset} bytes, "
            f"only {len(view) - offset} arrived"
        )
    body = view[start:end]
    (crc,) = _CRC.unpack_from(view, end)
    if crc != zlib.crc32(body):
        raise PayloadError(
            f"payload body of {header['kind']} {tuple(header['shape'])} is corrupt "
            "(CRC32 mismatch): it changed on the way; nothing was decoded"
        )
    codec = _decoder(header["codec"])
    try:
        raw = codec.decode(body, header["raw"]) if codec.name != "none" else body
    except Exception as exc:  # a codec's own error types differ (zlib.error, ZstdError, OSError)
        raise PayloadError(f"{codec.name} could not decode the payload body: {exc}") from exc
    if len(raw) != header["raw"]:
        raise PayloadError(
            f"{codec.name} decoded {len(raw)} bytes, the header says {header['raw']}"
        )
    arrays, at = {}, 0
    for name, dt, n in parts:
        arrays[name] = np.frombuffer(raw, dtype=dt, count=n, offset=at)
        at += dt.itemsize * n
    payload = Payload(header["kind"], tuple(header["shape"]), header["dtype"], arrays)
    return payload, end + _CRC.size


def pack_many(payloads: list[Payload], codec: Codec | None = None) -> bytes:
    """Return the frames of ``payloads`` back to back (one message for many tensors)."""
    return b"".join(pack(p, codec) for p in payloads)


def unpack_many(buf: bytes | bytearray | memoryview | np.ndarray, count: int) -> list[Payload]:
    """Return the ``count`` payloads framed back to back in ``buf``; raise if bytes are left over."""
    view = memoryview(buf).cast("B")
    payloads, offset = [], 0
    for _ in range(count):
        payload, offset = unpack(view, offset)
        payloads.append(payload)
    if offset != len(view):
        raise PayloadError(f"{len(view) - offset} bytes left after {count} payloads: expected none")
    return payloads
