"""Lecture 7: DDP with a compression hook: the kit's compressors, or torch's own ``fp16_compress_hook``.

::

    train_data_parallel(cluster, ..., method="ddp_compressed", compressor="int8",
                        error_feedback=True)                  # the kit's hook
    train_data_parallel(cluster, ..., method="ddp_compressed", hook="torch_fp16")  # torch's

Both wrap the model in ``DistributedDataParallel`` as :class:`~course_lib.parallel.exchanges.ddp.DDPExchange`
does and record each bucket's interval for the timeline. On an emulated link each bucket is
held back for the time the link takes to carry what the hook actually sent (the collectives and
bytes it reports in ``CompressionHookState.wire``: a compressed allreduce, or the sizes and the
padded frames of an allgather), so the kit's exchange and this bridge are compared on the same
link. Each bucket's record says what travelled (``wire``) and the link's time for it (``link_s``).
"""

from __future__ import annotations

import time
from typing import Any

from course_lib.compression.codecs import make_codec
from course_lib.compression.ddp_hook import CompressionHookState, compression_hook
from course_lib.compression.registry import make_compressor
from course_lib.parallel.exchanges.base import trainable_parameters
from course_lib.parallel.exchanges.ddp import DDPExchange

__all__ = ["HOOKS", "CompressedDDPExchange"]

HOOKS = ("kit", "torch_fp16")


class CompressedDDPExchange(DDPExchange):
    """DDP whose buckets go through a compression hook.

    Args:
        compressor, settings, error_feedback, codec, level, momentum_correction: as for method
            ``compressed``.
        hook: ``kit`` (:func:`~course_lib.compression.ddp_hook.compression_hook` with the
            compressor) or ``torch_fp16`` (torch's ``fp16_compress_hook``, for comparison).
        bucket_bytes: DDP's bucket size in bytes.
        find_unused_parameters: DDP's own switch, as for method ``ddp``: needed when a step may
            leave a parameter without a gradient; a parameter no rank used keeps ``grad = None``.
    """

    name = "ddp_compressed"
    compresses = True
    not_checkpointable_because = (
        "each rank keeps an error-feedback residual (and compression streams) between steps"
    )
    cost_collective = None

    def __init__(
        self,
        compressor: str = "float16",
        settings: dict[str, Any] | None = None,
        error_feedback: bool = False,
        codec: str = "none",
        level: int | None = None,
        hook: str = "kit",
        bucket_bytes: int = 25 << 20,
        momentum_correction: float = 0.0,
        find_unused_parameters: bool = False,
    ) -> None:
        super().__init__(bucket_bytes, find_unused_parameters)
        if hook not in HOOKS:
            raise ValueError(f"hook={hook!r}: choose one of {', '.join(HOOKS)}")
        self.hook = hook
        self.spec = (
            compressor,
            dict(settings or {}),
            bool(error_feedback),
            codec,
            level,
            float(momentum_correction),
        )
        self._state = self._new_state()  # validates the settings here, before any engine works

    def _new_state(self) -> CompressionHookState:
        compressor, settings, error_feedback, codec, level, momentum = self.spec
        comp = make_compressor(
            compressor, error_feedback=error_feedback, momentum_correction=momentum, **settings
        )
        return CompressionHookState(comp, make_codec(codec, level=level))

    def attach(self, comm, net):  # noqa: ANN001, ANN201 - same signature as DDPExchange.attach
        """Wrap ``net`` in DDP with the compression hook; fresh residuals for this run."""
        self._state = self._new_state()
        self._state.process_group = getattr(comm, "group", None)
        self._state.set_model(trainable_parameters(net))
        if hasattr(self._state.compressor, "reseed"):
            self._state.compressor.reseed(comm.rank)
        return super().attach(comm, net)

    def _hook(self, state, bucket):  # noqa: ANN001, ANN202 - DDP rejects string annotations
        """Run the chosen compression hook on one bucket, recording its interval."""
        start = time.time()
        buffer = bucket.buffer()
        self._state.wire = []
        if self.hook == "torch_fp16":
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
                fp16_compress_hook,
            )

            fut = fp16_compress_hook(self._state.process_group, bucket)
            self._state.wire.append(("allreduce", buffer.numel() * 2))  # float16 values
        else:
            fut = compression_hook(self._state, bucket)
        nbytes = buffer.numel() * buffer.element_size()
        record = {"index": bucket.index(), "nbytes": nbytes, "ready": start, "start": start}
        return self._then_link(fut, record, self._state.wire, lambda value: value)
