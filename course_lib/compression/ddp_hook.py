"""Lecture 7: The kit's compressors as a PyTorch DDP communication hook (``register_comm_hook``).

DDP hands each bucket of gradients (one flat tensor) to a hook, which must return a future of
the averaged bucket (Li et al. 2020; torch's ``fp16_compress_hook`` and PowerSGD are hooks).
:func:`compression_hook` runs the same compressor objects as the kit's own exchange:

* summable payloads (``none``, ``float16``) are divided by N in their own dtype and allreduced,
  exactly as torch's ``fp16_compress_hook`` does, so the two give the same bits;
* all others are framed (:mod:`~course_lib.compression.wire`), gathered from every rank (sizes
  first, then the frames padded to the longest), decoded and averaged in rank order, as the
  exchange's ``allgather`` carrier does.

::

    state = CompressionHookState(make_compressor("int8", error_feedback=True), make_codec("zstd"))
    ddp.register_comm_hook(state, compression_hook)

Error feedback needs each residual value to meet the same gradient value every step, but DDP
rebuilds its buckets after the first iteration, in the order the gradients became ready (the
reason PowerSGD's hook starts compressing only from iteration 2). So the hook first puts a
bucket's gradients in the model's parameter order (``positions``, set from the model) and keys
the residual by the parameters the bucket holds; the residual of the first iteration's buckets
is dropped if the rebuild regroups them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from course_lib.compression.base import Compressor, mean_in_rank_order
from course_lib.compression.codecs import Codec
from course_lib.compression.wire import pack, unpack

__all__ = ["CompressionHookState", "compression_hook"]


@dataclass
class CompressionHookState:
    """The hook's state: the compressor (with its residuals), the codec, the process group."""

    compressor: Compressor
    codec: Codec = field(default_factory=Codec)
    process_group: Any = None
    #: ``id(parameter) -> its position in the model`` (:meth:`set_model`); empty: bucket order.
    positions: dict[int, int] = field(default_factory=dict)
    #: ``(collective, bytes)`` of every collective the hook started, appended per bucket (the
    #: bytes as ``EmulatedLink.collective_time`` counts them: an allgather's whole output).
    wire: list[tuple[str, int]] = field(default_factory=list)

    def set_model(self, params: list[torch.nn.Parameter]) -> None:
        """Lay buckets out in the order of ``params`` (e.g. ``list(model.parameters())``)."""
        self.positions = {id(p): i for i, p in enumerate(params)}

    def __post_init__(self) -> None:
        if not isinstance(self.compressor, Compressor):
            raise TypeError(
                f"compressor must be a Compressor (use make_compressor('int8')), got {self.compressor!r}"
            )

    @property
    def summable(self) -> bool:
        """True when buckets travel by allreduce (summable payloads, no codec)."""
        return self.compressor.summable and self.codec.name == "none"


def compression_hook(state: CompressionHookState, bucket: Any) -> torch.futures.Future:
    """Average one DDP bucket through ``state.compressor``; return a future of the bucket."""
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world_size = dist.get_world_size(group)
    buffer = bucket.buffer()
    canonical, name, restore = _canonical(state, bucket)
    payload, _ = state.compressor.compress(canonical, name)
    if state.summable:
        state.compressor.prescale(payload, world_size)  # what fp16_compress_hook's div_ does
        values = torch.from_numpy(payload.parts["values"])
        state.wire.append(("allreduce", values.numel() * values.element_size()))
        fut = dist.all_reduce(values, group=group, async_op=True).get_future()

        def unpack_sum(f: torch.futures.Future) -> torch.Tensor:
            payload.parts["values"] = f.value()[0].numpy()
            restore(state.compressor.decompress(payload).reshape(-1))
            return buffer

        return fut.then(unpack_sum)
    frame = torch.frombuffer(bytearray(pack(payload, state.codec)), dtype=torch.uint8)
    sizes = torch.empty(world_size, dtype=torch.int64)
    dist.all_gather_into_tensor(sizes, torch.tensor([frame.numel()]), group=group)
    longest = int(sizes.max())
    state.wire += [("allgather", sizes.numel() * 8), ("allgather", world_size * longest)]
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[: frame.numel()] = frame
    rows = torch.empty(world_size * longest, dtype=torch.uint8)
    fut = dist.all_gather_into_tensor(rows, padded, group=group, async_op=True).get_future()

    def decode_mean(f: torch.futures.Future) -> torch.Tensor:
        table = rows.numpy().reshape(world_size, longest)
        decoded = [
            state.compressor.decompress(unpack(table[r, : int(sizes[r])])[0])
            for r in range(world_size)
        ]
        restore(mean_in_rank_order(decoded))
        return buffer

    return fut.then(decode_mean)


def _canonical(state: CompressionHookState, bucket: Any) -> tuple[torch.Tensor, str, Any]:
    """Return the bucket's gradients in model order, a name for them, and a function to put
    values (in that order) back into the bucket."""
    buffer = bucket.buffer()
    params = bucket.parameters()
    if not state.positions or not params:
        return buffer, f"bucket{bucket.index()}", lambda v: buffer.copy_(torch.from_numpy(v))
    keys = [state.positions[id(p)] for p in params]
    sizes = [p.numel() for p in params]
    starts = np.concatenate([[0], np.cumsum(sizes)])  # gradients lie back to back in the bucket
    order = sorted(range(len(params)), key=keys.__getitem__)
    canonical = torch.cat([buffer[starts[i] : starts[i + 1]] for i in order])
    name = "params " + ",".join(str(keys[i]) for i in order)

    def restore(values: np.ndarray) -> None:
        at = 0
        for i in order:
            buffer[starts[i] : starts[i + 1]] = torch.from_numpy(values[at : at + sizes[i]])
            at += sizes[i]

    return canonical, name, restore
