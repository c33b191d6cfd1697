"""Lecture 7: Compressed gradient exchange: compensate, compress, code, communicate, decode, decompress, average.

::

    train_data_parallel(cluster, model="mlp", dataset=load_digits, config=config,
                        method="compressed", compressor="int8", error_feedback=True, codec="zstd")

Each step, on every rank: add the error-feedback residual (*compensate*), turn each gradient into
a payload (*compress*), frame it with a checked header and code its bytes losslessly (*code*),
send it (*communicate*), then check and decode every rank's frame (*decode*), turn payloads back
into float32 (*decompress*) and take the mean (*average*). Each stage's seconds and the bytes
before and after it go into the step's record (``compress_s``, ``code_s``, ``decode_s``,
``decompress_s``; ``bytes_gradient``, ``bytes_compressed``, ``bytes_coded`` of this rank's own
gradient, and on a parameter server ``bytes_coded_downlink`` of the mean it sends back),
communication into the ``comm`` phase.

Presence flags ride with every carrier, as with the uncompressed methods (one per trainable
tensor, :func:`~course_lib.parallel.exchanges.base.flatten_grads`): a parameter that no rank
has a gradient for on a step keeps ``grad = None``, as one process and PyTorch DDP leave it (a
zero gradient would let momentum move it). They are never compressed: the allreduce carrier
appends them to the summed values (in the values' dtype; float16 counts ranks exactly), the
framed carriers send them as a first float32 frame before the gradient's. ``bytes_coded``
counts the gradient's bytes only; the flags are the run's ``flag_bytes``.

How payloads travel (``carrier``):

* ``allreduce``: summable payloads (``none``, ``float16``) are divided by N in their own dtype
  and summed by the kit's ring allreduce; no header and no codec, since the sum of two coded
  byte strings means nothing.
* ``allgather``: every rank gathers every rank's frame (sizes first, then the frames padded to
  the longest) and sums the decoded gradients in rank order, so every replica computes the same
  bits. Sparse and scaled payloads need this: their indices and scales differ between ranks.
* ``parameter_server``: source 000's star. Workers send size then frame to rank 0; rank 0 decodes,
  averages, compresses the mean again (quantisers again, with their own error feedback when
  asked, as the source sent int8 both ways; sparse payloads as the exact non-zeros of the mean,
  at most N times as many as one rank sent) and sends it back; every rank, rank 0 included, applies the
  decoded downlink, so the replicas stay equal.

Kept whole: one exchange whose seven stages run in one step; its byte helpers serve it alone.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from course_lib.collectives.ring import ring_allreduce
from course_lib.comm.communicator import Communicator, wait_all
from course_lib.compression.base import Compressor, Payload, mean_in_rank_order
from course_lib.compression.codecs import make_codec
from course_lib.compression.error_feedback import ErrorFeedback
from course_lib.compression.registry import make_compressor
from course_lib.compression.wire import pack, pack_many, unpack_many
from course_lib.parallel.exchanges.base import (
    GradientExchange,
    StepTimeline,
    flatten_grads,
    trainable_parameters,
    unflatten_into_grads,
)

__all__ = ["CARRIERS", "SIZE_TAG", "FRAME_TAG", "CompressedExchange"]

CARRIERS = ("auto", "allreduce", "allgather", "parameter_server")
SPARSIFIERS = ("topk", "randomk", "threshold")
SIZE_TAG, FRAME_TAG = 8140, 8141  # clear of the collectives' 8100-8108 and the server's 8120


class CompressedExchange(GradientExchange):
    """Exchange compressed gradients; every rank must use the same settings.

    Args:
        compressor: a name in :data:`~course_lib.compression.registry.COMPRESSORS`, or a
            :class:`~course_lib.compression.base.Compressor` of your own (each rank and each
            ``attach`` works on a fresh copy of it; one defined in a notebook travels by value).
        settings: the compressor's settings, e.g. ``{"ratio": 0.01}`` for ``topk``.
        error_feedback: keep what compression dropped and send it later (per tensor).
        momentum_correction: DGC's momentum correction in the error feedback (Lin et al. 2018):
            the SGD momentum, e.g. 0.9, applied on each rank before compression; train with
            ``TrainConfig(momentum=0)`` then (the receivers apply plain SGD to the mean).
        codec, level, codec_options: the lossless stage (``none``, ``zlib``, ``zstd``, ``mgzip``).
        carrier: ``auto`` (allreduce when payloads can be summed and no codec is used, else
            allgather), ``allreduce``, ``allgather`` or ``parameter_server``.
        granularity: ``flat`` compresses the whole flattened gradient at once (one int8 scale,
            one top-k over all values, as source 000 did), ``tensor`` each parameter apart.
    """

    name = "compressed"
    compresses = True
    not_checkpointable_because = (
        "each rank keeps an error-feedback residual (and compression streams) between steps"
    )
    sends_presence_flags = True

    def __init__(
        self,
        compressor: str | Compressor = "none",
        settings: dict[str, Any] | None = None,
        error_feedback: bool = False,
        codec: str = "none",
        level: int | None = None,
        codec_options: dict[str, Any] | None = None,
        carrier: str = "auto",
        granularity: str = "flat",
        momentum_correction: float = 0.0,
    ) -> None:
        if momentum_correction and not error_feedback:
            raise ValueError(
                "momentum_correction lives in the error feedback's memory: add error_feedback=True"
            )
        self.momentum_correction = float(momentum_correction)
        if isinstance(compressor, Compressor):
            if settings:
                raise ValueError(
                    "settings= is for compressors given by name; give your compressor object "
                    "its settings when you build it"
                )
            self.prototype, compressor = compressor, compressor.name
        elif isinstance(compressor, str):
            self.prototype = None
        else:
            raise TypeError(
                f"compressor={compressor!r}: give a name (e.g. 'int8') or a Compressor object"
            )
        self.compressor_name, self.settings = compressor, dict(settings or {})
        self.error_feedback = bool(error_feedback)
        self.codec_name, self.codec_settings = codec, {"level": level, **(codec_options or {})}
        self.compressor = self._new_compressor()  # validates the settings, with advice
        self.codec = make_codec(codec, **self.codec_settings)
        if carrier not in CARRIERS:
            raise ValueError(f"carrier={carrier!r}: choose one of {', '.join(CARRIERS)}")
        if granularity not in ("flat", "tensor"):
            raise ValueError(
                f"granularity={granularity!r}: use 'flat' (one payload for the whole gradient) "
                "or 'tensor' (one per parameter)"
            )
        summable = self.compressor.summable and codec == "none"
        if carrier == "auto":
            carrier = "allreduce" if summable else "allgather"
        if carrier == "allreduce" and not summable:
            why = (
                f"the sum of {codec}-coded bytes means nothing: use codec='none', or"
                if self.compressor.summable
                else f"{compressor} payloads cannot be summed (each rank has its own scale or "
                "indices, and int8 sums would overflow): use"
            )
            raise ValueError(
                f"carrier='allreduce': {why} carrier='allgather' or 'parameter_server'"
            )
        self.carrier, self.granularity = carrier, granularity
        self._flag_itemsize = 4  # float32 flags; the allreduce carrier sums them in its dtype

    def _new_compressor(self, momentum: float | None = None) -> Compressor:
        momentum = self.momentum_correction if momentum is None else momentum
        if self.prototype is not None:  # a fresh copy: no residuals shared between runs
            fresh = copy.deepcopy(self.prototype)
            return ErrorFeedback(fresh, momentum=momentum) if self.error_feedback else fresh
        return make_compressor(
            self.compressor_name,
            error_feedback=self.error_feedback,
            momentum_correction=momentum,
            **self.settings,
        )

    def _new_downlink(self) -> Compressor:
        """Return the compressor for the server's mean: the mean of sparse vectors is sparse
        (at most N k values), so its non-zeros go exactly; quantisers quantise it again, with
        their own error feedback when asked (source 000 sent int8 both ways); a compressor
        object of your own compresses the mean again with a fresh copy of itself. The mean is
        of velocities already under momentum correction: no second momentum on the way down."""
        if self.prototype is None and self.compressor_name in SPARSIFIERS:
            return make_compressor("threshold", threshold=0.0)
        return self._new_compressor(momentum=0.0)

    def attach(self, comm: Communicator, net: nn.Module) -> nn.Module:
        """Start fresh residuals and give stochastic compressors this rank's random stream."""
        self.compressor = self._new_compressor()
        self.downlink = self._new_downlink()
        for comp, stream in ((self.compressor, comm.rank), (self.downlink, comm.world_size)):
            if hasattr(comp, "reseed"):
                comp.reseed(stream)
        names = {id(p): name for name, p in net.named_parameters()}
        self._names = [names[id(p)] for p in trainable_parameters(net)]
        return net

    # ---- the pipeline -----------------------------------------------------------------------
    def exchange(self, comm: Communicator, net: nn.Module, timeline: StepTimeline) -> None:
        """Replace every trainable ``p.grad`` by the mean of the ranks' compressed gradients.

        A parameter that no rank has a gradient for keeps ``grad = None`` (its presence flag
        travels uncompressed beside the payloads and sums to 0).
        """
        params = trainable_parameters(net)
        buffer = flatten_grads(params, flags=True).numpy()
        flat, flags = buffer[: buffer.size - len(params)], buffer[buffer.size - len(params) :]
        self._bounds = np.cumsum([0] + [p.numel() for p in params])
        pieces = self._pieces(flat)
        start = time.perf_counter()
        payloads = [self.compressor.compress(g, name)[0] for name, g in pieces]
        timeline.note("compress_s", time.perf_counter() - start)
        timeline.note("bytes_gradient", flat.nbytes)
        timeline.note("bytes_compressed", sum(p.nbytes for p in payloads))
        if self.carrier == "allreduce":
            mean, present = self._allreduce(comm, payloads, flags, timeline)
        elif self.carrier == "allgather":
            mean, present = self._allgather(comm, payloads, flags, timeline)
        else:
            mean, present = self._parameter_server(comm, payloads, flags, timeline)
        averaged = np.concatenate([mean, np.asarray(present, np.float32)])
        unflatten_into_grads(torch.from_numpy(averaged), params, flags=True)

    def flag_bytes(self, tensors: int) -> int:
        """Return the bytes of presence flags for ``tensors`` tensors: 4 each, 2 in float16 sums."""
        return self._flag_itemsize * tensors

    def _pieces(self, flat: np.ndarray) -> list[tuple[str, np.ndarray]]:
        """Return ``(name, values)`` to compress: the whole gradient, or one per parameter."""
        if self.granularity == "flat":
            return [("flat", flat)]
        b = self._bounds
        return [(name, flat[b[i] : b[i + 1]]) for i, name in enumerate(self._names)]

    def _decompress(self, payloads: list[Payload], compressor: Compressor | None = None):
        compressor = compressor or self.compressor
        parts = [compressor.decompress(p).reshape(-1) for p in payloads]
        return np.concatenate(parts).astype(np.float32, copy=False)

    def _code(self, payloads: list[Payload], timeline: StepTimeline, key: str = "bytes_coded"):
        start = time.perf_counter()
        frame = np.frombuffer(pack_many(payloads, self.codec), np.uint8)
        timeline.note("code_s", time.perf_counter() - start)
        timeline.note(key, frame.nbytes)
        return frame

    @staticmethod
    def _flag_frame(flags: np.ndarray) -> np.ndarray:
        """Return the presence flags as one uncoded float32 frame (it goes before the gradient's)."""
        payload = Payload("presence", (flags.size,), "float32", {"values": flags})
        return np.frombuffer(pack(payload), np.uint8)

    def _mean_of_frames(self, frames: list[np.ndarray], count: int, timeline: StepTimeline):
        """Decode every rank's frame, decompress, and average in rank order.

        Return the mean and, per tensor, how many ranks had a gradient for it.
        """
        start = time.perf_counter()
        decoded = [unpack_many(f, 1 + count) for f in frames]  # PayloadError on corruption
        middle = time.perf_counter()
        total = mean_in_rank_order([self._decompress(payloads[1:]) for payloads in decoded])
        present = np.sum([payloads[0].parts["values"] for payloads in decoded], axis=0)
        timeline.note("decode_s", middle - start)
        timeline.note("decompress_s", time.perf_counter() - middle)
        return total, present

    # ---- the carriers -----------------------------------------------------------------------
    def _allreduce(self, comm: Communicator, payloads: list[Payload], flags, timeline):
        for p in payloads:  # divide before the sum, as torch's DDP hooks do (no float16 overflow)
            self.compressor.prescale(p, comm.world_size)
        values = np.concatenate([p.parts["values"] for p in payloads])
        timeline.note("bytes_coded", values.nbytes)  # no header, no codec: the values travel
        self._flag_itemsize = values.dtype.itemsize  # the flags follow in the values' dtype
        values = np.concatenate([values, flags.astype(values.dtype)])  # summed: ranks with one
        start = time.time()
        ring_allreduce(comm, values)
        timeline.mark("comm", start)
        present = values[values.size - flags.size :].astype(np.float32)
        start, offset = time.perf_counter(), 0
        for p in payloads:
            n = p.parts["values"].size
            p.parts["values"] = values[offset : offset + n]
            offset += n
        mean = self._decompress(payloads)
        timeline.note("decompress_s", time.perf_counter() - start)
        return mean, present

    def _allgather(self, comm: Communicator, payloads: list[Payload], flags, timeline):
        frame = np.concatenate([self._flag_frame(flags), self._code(payloads, timeline)])
        start = time.time()
        frames = allgather_bytes(comm, frame)
        timeline.mark("comm", start)
        return self._mean_of_frames(frames, len(payloads), timeline)

    def _parameter_server(self, comm: Communicator, payloads: list[Payload], flags, timeline):
        frame = np.concatenate([self._flag_frame(flags), self._code(payloads, timeline)])
        count, n = len(payloads), comm.world_size
        start = time.time()
        if comm.rank != 0:
            send_bytes(comm, frame, 0)
            down = recv_bytes(comm, 0)
            timeline.mark("comm", start)
        else:  # the server's comm phase includes its decoding and averaging: workers wait for it
            frames = [frame] + [recv_bytes(comm, r) for r in range(1, n)]
            mean, present = self._mean_of_frames(frames, count, timeline)
            again = time.perf_counter()
            down_payloads = [
                self.downlink.compress(g, f"down/{name}")[0] for name, g in self._pieces(mean)
            ]
            timeline.note("compress_s", time.perf_counter() - again)
            down = np.concatenate(
                [
                    self._flag_frame((present > 0).astype(np.float32)),
                    self._code(down_payloads, timeline, "bytes_coded_downlink"),
                ]
            )
            wait_all([h for r in range(1, n) for h in isend_bytes(comm, down, r)])
            timeline.mark("comm", start)
        begin = time.perf_counter()
        decoded = unpack_many(down, 1 + count)
        mean = self._decompress(decoded[1:], self.downlink)
        timeline.note("decompress_s", time.perf_counter() - begin)
        return mean, decoded[0].parts["values"]

    def __repr__(self) -> str:
        ef = " + error feedback" if self.error_feedback else ""
        ef += (
            f" (momentum correction {self.momentum_correction:g})"
            if self.momentum_correction
            else ""
        )
        return (
            f"<CompressedExchange {self.compressor_name}{ef}, codec {self.codec_name}, "
            f"{self.carrier}, {self.granularity}>"
        )


def allgather_bytes(comm: Communicator, frame: np.ndarray) -> list[np.ndarray]:
    """Return every rank's ``frame`` (uint8, any length) in rank order; every rank calls it.

    The communicator moves buffers of one size, so the sizes are gathered first and the frames
    then travel padded to the longest.
    """
    if comm.world_size == 1:
        return [frame]
    sizes = comm.allgather(np.array([frame.size], np.int64)).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: frame.size] = frame
    rows = comm.allgather(padded)
    return [rows[r, : int(sizes[r])] for r in range(comm.world_size)]


def isend_bytes(comm: Communicator, frame: np.ndarray, dst: int) -> list[Any]:
    """Start sending ``frame``'s size, then ``frame``, to ``dst``; return both handles."""
    return [
        comm.isend(np.array([frame.size], np.int64), dst, SIZE_TAG),
        comm.isend(frame, dst, FRAME_TAG),
    ]


def send_bytes(comm: Communicator, frame: np.ndarray, dst: int) -> None:
    """Send ``frame``'s size, then ``frame``, to ``dst``, which calls :func:`recv_bytes`."""
    wait_all(isend_bytes(comm, frame, dst))


def recv_bytes(comm: Communicator, src: int) -> np.ndarray:
    """Receive a frame of any length sent by :func:`send_bytes` from ``src``."""
    size = comm.recv(np.zeros(1, np.int64), src, SIZE_TAG)
    return comm.recv(np.empty(int(size[0]), np.uint8), src, FRAME_TAG)
