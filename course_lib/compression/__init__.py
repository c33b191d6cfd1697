"""Gradient compression (lectures 7 and 8a): compressors, error feedback, lossless codecs, wire.

::

    comp = make_compressor("int8", error_feedback=True)
    payload, ctx = comp.compress(grad, name="fc.weight")
    frame = pack(payload, make_codec("zstd"))        # bytes with a checked header
    grad_hat = comp.decompress(unpack(frame)[0])     # same shape and dtype as grad

The exchange that runs them inside data-parallel training is
:mod:`course_lib.parallel.exchanges.compressed`; the PyTorch DDP hook is
:mod:`course_lib.compression.ddp_hook`.
"""

from course_lib.compression.base import Compressor, Payload, PayloadError
from course_lib.compression.codecs import CODECS, Codec, make_codec
from course_lib.compression.error_feedback import ErrorFeedback
from course_lib.compression.registry import COMPRESSORS, make_compressor
from course_lib.compression.wire import pack, pack_many, unpack, unpack_many

__all__ = [
    "CODECS",
    "COMPRESSORS",
    "Codec",
    "Compressor",
    "ErrorFeedback",
    "Payload",
    "PayloadError",
    "make_codec",
    "make_compressor",
    "pack",
    "pack_many",
    "unpack",
    "unpack_many",
]
