"""No lecture (the grader). Reading a line the kernel printed, as data that cannot hurt the grader.

Everything a probe cell prints comes from the student's kernel, which can print anything: a
line of a million nested brackets (``json.loads`` would recurse until ``RecursionError``),
gigabytes, ``NaN`` and ``Infinity`` (JSON's extensions that Python accepts). :func:`marked_json`
measures a line before parsing it: too long or nested too deep, and it is refused without
allocating anything for it; non-finite numbers are refused while parsing. A refusal is a
:class:`KernelDataError` whose message becomes the exercise's reason.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import re
from typing import Any

import numpy as np

__all__ = [
    "MAX_ARRAY_BYTES",
    "MAX_DEPTH",
    "MAX_LINE_CHARS",
    "KernelDataError",
    "Unsupported",
    "decode_value",
    "marked_json",
    "nesting_depth",
]

#: The deepest nesting of JSON arrays and objects a probe's line may have: the probe's encoding
#: nests a result list, a case, a value and its tuples and lists (A5.6's per-image records reach
#: 17); 64 leaves room and still refuses a line built to exhaust the decoder's recursion.
MAX_DEPTH = 64
#: The longest line read (a probe's arrays are bounded at 16 MiB each as ``.npy``, base64).
MAX_LINE_CHARS = 64 * 2**20

#: The largest array a result may hold, as ``.npy`` bytes.
MAX_ARRAY_BYTES = 16 * 2**20

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


class KernelDataError(ValueError):
    """A line from the kernel that is not data the grader reads (too deep, too big, non-finite)."""


def nesting_depth(text: str) -> int:
    """The deepest nesting of ``[`` and ``{`` in ``text`` outside JSON strings (no parsing)."""
    raw = _STRING.sub(b'""', text.encode("utf-8", "surrogatepass"))
    codes = np.frombuffer(raw, np.uint8)
    if codes.size == 0:
        return 0
    steps = (codes == ord("[")).astype(np.int64) + (codes == ord("{"))
    steps -= (codes == ord("]")).astype(np.int64) + (codes == ord("}"))
    return int(np.cumsum(steps).max(initial=0))


def _refuse_constant(name: str) -> Any:
    raise KernelDataError(f"a number that is not finite ({name})")


def _finite_float(text: str) -> float:
    value = float(text)
    if value - value != 0:  # 1e999 parses to inf
        raise KernelDataError(f"a number that is not finite ({text[:40]})")
    return value


def marked_json(stdout: str, mark: str, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON after the last line starting with ``mark`` (None if none); KernelDataError if unsafe."""
    lines = [line for line in stdout.splitlines() if line.startswith(mark)]
    if not lines:
        return None
    text = lines[-1][len(mark) :]
    if len(text) > MAX_LINE_CHARS:
        raise KernelDataError(f"a line of {len(text)} characters (at most {MAX_LINE_CHARS})")
    depth = nesting_depth(text)
    if depth > max_depth:
        raise KernelDataError(f"data nested {depth} deep (at most {max_depth})")
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except KernelDataError:
        raise
    except (ValueError, RecursionError, MemoryError) as exc:
        raise KernelDataError(f"not JSON ({type(exc).__name__})") from None


class Unsupported(str):
    """An answer's value of a type that is not data (a string says which)."""


def _array(raw: bytes) -> np.ndarray | Unsupported:
    """An ``.npy`` of numbers whose header agrees with its size, read without pickles."""
    stream = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(stream)
        read = {(1, 0): np.lib.format.read_array_header_1_0}.get(
            version, np.lib.format.read_array_header_2_0
        )
        shape, _fortran, dtype = read(stream)
    except Exception:  # noqa: BLE001 - a header of the kernel's making: tokenize, ast, ... errors
        return Unsupported("<undecodable array>")
    if dtype.kind not in "biufc" or dtype.hasobject:
        return Unsupported("<not numbers>")
    if len(shape) > 8 or any(not isinstance(n, int) or n < 0 for n in shape):
        return Unsupported("<undecodable array>")
    # the header's shape is checked against the bytes that follow before numpy allocates it
    if int(np.prod(shape, dtype=object)) * dtype.itemsize != len(raw) - stream.tell():
        return Unsupported("<undecodable array>")
    try:
        array = np.load(io.BytesIO(raw), allow_pickle=False)
    except Exception:  # noqa: BLE001 - the header was checked; anything else is not an array
        return Unsupported("<undecodable array>")
    if array.dtype.kind in "fc" and not np.isfinite(array).all():
        return Unsupported("<an array with numbers that are not finite>")
    return array


def decode_value(value: Any, depth: int = 0) -> Any:
    """Decode the kernel's encoding of one result: arrays, tuples, lists, None; nothing else."""
    if depth > 8 or not isinstance(value, dict) or len(value) != 1:
        return Unsupported("<not data>")
    ((kind, inner),) = value.items()
    if kind in ("tuple", "list") and isinstance(inner, list) and len(inner) <= 64:
        items = [decode_value(v, depth + 1) for v in inner]
        return tuple(items) if kind == "tuple" else items
    if kind == "none":
        return None
    if kind == "npy" and isinstance(inner, str) and len(inner) <= MAX_ARRAY_BYTES * 4 // 3 + 4:
        try:
            raw = base64.b64decode(inner, validate=True)
        except (binascii.Error, ValueError):
            return Unsupported("<undecodable array>")
        if not raw.startswith(b"\x93NUMPY"):
            return Unsupported("<not an array>")
        return _array(raw)
    if kind == "str" and isinstance(inner, str):
        return inner[:200]
    if kind == "type" and isinstance(inner, str):
        return Unsupported(f"<{inner[:40]}>")
    return Unsupported("<not data>")
