"""The seam of data parallelism: one object that turns every rank's gradients into their mean.

A data-parallel step is: forward + backward on this rank's shard, **exchange**, optimiser step
(source 000, steps 4-6). Everything that differs between the methods of lectures 4-8 lives in
the exchange object; the training loop never changes. An exchange is asked, in this order:

* ``attach(comm, net)`` once on every rank: return the module to run forward on (DDP wraps
  ``net``; bucketed exchanges register autograd hooks here);
* ``wrap_optimizer(comm, optimizer)`` once: return the optimiser to step (a sharded optimiser,
  ZeRO stage 1-3, replaces it here; the default keeps it);
* ``exchange(comm, net, timeline)`` after every backward: leave in each trainable ``p.grad`` the
  mean over all ranks, recording when communication ran in ``timeline``;
* ``after_step(comm, net, step, timeline)`` after every optimiser step (Local-SGD averages
  *weights* every ``p`` steps here, source 001 Algorithm 1, marking the ``sync`` phase; the
  default does nothing);
* ``detach()`` at the end.

Waiting is measured by the recorder with a barrier, and only where the method really waits for
every rank: ``sync_point`` says where (``"exchange"``: after backward, before the exchange;
``"after_step"``: after the optimiser step, before weight averaging) and
``synchronises_at(step)`` says at which steps. A barrier at every step would make Local-SGD(p)
wait every step, which it does not; gossip waits only for its two partners, inside its ``comm``
time, so it answers False everywhere.

This module holds the base class and the methods that exchange one flat buffer after backward:
``allreduce_naive``, ``ring`` and ``builtin``. The registry of all methods by name is
:mod:`course_lib.parallel.exchanges.registry`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from course_lib.collectives.ring_pipelined import ring_allreduce_in_segments
from course_lib.collectives.star import allreduce_naive
from course_lib.comm.by_value import ByValue
from course_lib.comm.communicator import Communicator

__all__ = [
    "BuiltinAllreduce",
    "FlatExchange",
    "GradientExchange",
    "NaiveAllreduce",
    "RingAllreduce",
    "StepTimeline",
    "flatten_grads",
    "trainable_parameters",
    "unflatten_into_grads",
]


@dataclass
class StepTimeline:
    """Wall-clock marks (``time.time()``) of one step on one rank, filled by the loop and exchange.

    ``phases`` maps a phase name (``compute``, ``wait``, ``comm``, ``step``, ``sync``) to its
    ``(start, end)``; ``buckets`` holds one dict per bucket communicated during or after
    backward: ``index``, ``nbytes``, ``ready`` (its gradients were all produced), ``start`` and
    ``end`` of its communication. ``notes`` holds numbers an exchange wants in the step's record
    (bytes before and after compression, seconds per stage, ...); they are added up per step.
    ``events`` holds what else an exchange did, one dict each (stage 3: each unit's allgather
    and each module's forward), in the record as ``events`` when there are any.
    """

    phases: dict[str, tuple[float, float]] = field(default_factory=dict)
    buckets: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    notes: dict[str, float] = field(default_factory=dict)

    def mark(self, phase: str, start: float, end: float | None = None) -> None:
        """Record that ``phase`` ran from ``start`` to ``end`` (default: now)."""
        self.phases[phase] = (start, time.time() if end is None else end)

    def note(self, key: str, value: float) -> None:
        """Add ``value`` to this step's ``key`` (a new key starts at 0); it lands in the record."""
        self.notes[key] = self.notes.get(key, 0) + value


def trainable_parameters(net: nn.Module) -> list[nn.Parameter]:
    """Return ``net``'s parameters that need gradients, in registration order, each once.

    Tied weights appear once (``parameters()`` removes duplicates); frozen ones are left out,
    so they are neither sent nor counted.
    """
    return [p for p in net.parameters() if p.requires_grad]


def flatten_grads(params: list[nn.Parameter], flags: bool = False) -> torch.Tensor:
    """Return one new contiguous float32 tensor holding every ``p.grad`` (zeros where None).

    A parameter that took no part in this step's graph has no gradient; it contributes zeros,
    so every rank's buffer has the same size (what DDP does for unused parameters). With
    ``flags``, one presence flag per parameter follows the values: 1 where this rank has a
    gradient, 0 where not; averaged with the values, a flag stays 0 only where no rank had one.
    """
    parts = [
        (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in params
    ]
    if flags:
        parts.append(torch.tensor([float(p.grad is not None) for p in params]))
    return torch.cat(parts) if parts else torch.zeros(0)


def unflatten_into_grads(
    flat: torch.Tensor, params: list[nn.Parameter], flags: bool = False
) -> None:
    """Overwrite each ``p.grad`` with its slice of ``flat`` (the layout of :func:`flatten_grads`).

    With ``flags``, a parameter whose averaged flag is 0 (no rank had a gradient for it: a
    skipped branch, stochastic depth) keeps ``grad = None``, as one process would leave it:
    a zero gradient instead would let momentum and weight decay move it.
    """
    offset, present = 0, flat[-len(params) :] if flags and params else None
    for k, p in enumerate(params):
        n = p.numel()
        if present is not None and present[k] == 0:
            p.grad = None
        else:
            p.grad = flat[offset : offset + n].view_as(p).to(p.dtype).clone()
        offset += n


class GradientExchange(ByValue):
    """Base class: how a data-parallel step turns local gradients into the global mean.

    Subclasses set ``name`` and override :meth:`exchange` (and, where needed, the other hooks
    described in this module's docstring). Every rank must use the same method with the same
    settings, and call each hook the same number of times. What the kit knows about a method
    lives here too, as class attributes, so a method defined in a notebook is complete: pass an
    instance to ``train_data_parallel(method=...)`` and it travels to the engines by value.
    Keep ``__init__`` to settings (threads, queues and hooks belong in ``attach``).
    """

    name: ClassVar[str] = "abstract"
    #: True when communication runs during backward (its timeline has bucket intervals).
    overlaps_backward: ClassVar[bool] = False
    #: True when every rank applies the same averaged gradient at every step (bulk-synchronous);
    #: False for Local-SGD and gossip, whose replicas drift apart between averagings.
    averages_every_step: ClassVar[bool] = True
    #: True when the gradient travels lossy-compressed (the run is no longer one process's).
    compresses: ClassVar[bool] = False
    #: True when rank 0's weights and optimiser state after every step are the whole run's
    #: state, so the run can be saved and resumed; else ``not_checkpointable_because`` says why.
    checkpointable: ClassVar[bool] = False
    not_checkpointable_because: ClassVar[str] = (
        "it is not known to keep its whole state in rank 0's weights"
    )
    #: True when the exchange carries one presence flag (a float32) per trainable tensor with
    #: the values, so that a parameter no rank has a gradient for keeps ``grad = None``: build
    #: the buffer with ``flatten_grads(..., flags=True)``, average the flags with the values and
    #: undo it with ``unflatten_into_grads(..., flags=True)``.
    sends_presence_flags: ClassVar[bool] = False
    #: The collective whose alpha-beta cost one step pays (``cost_model.alpha_beta.predict``'s
    #: names); None where the cost model has none for this method.
    cost_collective: ClassVar[str | None] = None
    #: Notes of a step's record that the notebook's progress bar shows while the run trains
    #: (``{note: label}``, e.g. ``{"noise_scale": "B_noise"}``): rank 0 publishes them with its
    #: step count (``train_data_parallel(progress=True)``; ``result.published`` keeps them).
    live_notes: ClassVar[dict[str, str]] = {}
    #: Where the method waits for every rank: ``"exchange"`` (after backward) or ``"after_step"``.
    sync_point: str = "exchange"

    def synchronises_at(self, step: int) -> bool:
        """Return True when step ``step`` (from 0) waits for every rank at ``sync_point``.

        The recorder times a barrier there (``wait``); default: every step (bulk-synchronous).
        """
        return True

    def attach(self, comm: Communicator, net: nn.Module) -> nn.Module:
        """Prepare for training ``net``; return the module whose forward the loop calls."""
        return net

    def wrap_optimizer(self, comm: Communicator, optimizer: torch.optim.Optimizer) -> Any:
        """Return the optimiser to step (sharded optimisers replace it; default: unchanged)."""
        return optimizer

    def optimizer_shards(self, world_size: int) -> dict[str, int] | None:
        """Return how the optimiser state is cut over the ranks (None: every rank holds it all).

        A checkpoint of a sharded run keeps every rank's shard and resumes only where this
        answer is the same (the same stage on the same number of ranks).
        """
        return None

    def flag_bytes(self, tensors: int) -> int:
        """Return the bytes of presence flags one rank's exchange adds for ``tensors`` tensors."""
        return 4 * tensors if self.sends_presence_flags else 0

    def exchange(self, comm: Communicator, net: nn.Module, timeline: StepTimeline) -> None:
        """Replace every trainable ``p.grad`` by its mean over all ranks; every rank calls it."""
        raise NotImplementedError(f"{type(self).__name__} must implement exchange()")

    def after_step(
        self, comm: Communicator, net: nn.Module, step: int, timeline: StepTimeline
    ) -> None:
        """Run after optimiser step ``step`` (counting from 0), marking ``sync``; default: nothing."""

    def detach(self) -> None:
        """Remove hooks and threads set up by :meth:`attach`."""

    def for_saved_run(self) -> GradientExchange:
        """Return the exchange a saved or resumed run uses: one that repeats itself bit for bit."""
        return self

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class FlatExchange(GradientExchange):
    """Flatten all gradients into one buffer, reduce it after backward, divide, unflatten.

    Subclasses implement :meth:`average` on a flat float32 NumPy view (in place). The buffer ends
    with one presence flag per trainable tensor (see :func:`flatten_grads`).
    """

    sends_presence_flags = True

    def exchange(self, comm: Communicator, net: nn.Module, timeline: StepTimeline) -> None:
        """Replace every trainable ``p.grad`` by its mean over all ranks; every rank calls it."""
        params = trainable_parameters(net)
        flat = flatten_grads(params, flags=True)
        start = time.time()
        self.average(comm, flat.numpy())
        timeline.mark("comm", start)
        unflatten_into_grads(flat, params, flags=True)

    def average(self, comm: Communicator, flat: np.ndarray) -> None:
        """Overwrite ``flat`` in place with the mean of every rank's ``flat``."""
        raise NotImplementedError(f"{type(self).__name__} must implement average()")


class NaiveAllreduce(FlatExchange):
    """Every rank sends its whole gradient to every other rank and sums all N in rank order.

    Nobody uses it in practice: each rank sends and receives $(N-1) S$ bytes for an ``S``-byte
    gradient, so the time grows with the world size (the ring sends $2\\frac{N-1}{N} S$).
    """

    name = "allreduce_naive"
    checkpointable = True
    cost_collective = "allreduce_naive"

    def average(self, comm: Communicator, flat: np.ndarray) -> None:
        """Overwrite ``flat`` with the mean over ranks, gathered everywhere."""
        allreduce_naive(comm, flat)
        flat /= comm.world_size


class RingAllreduce(FlatExchange):
    """The kit's from-scratch ring allreduce: reduce-scatter then allgather round the ring.

    Each rank sends and receives $2\\frac{N-1}{N} S$ bytes whatever ``N`` is: bandwidth-optimal
    (Patarasuk & Yuan 2009), what Horovod and NCCL use for large buffers.
    """

    name = "ring"
    checkpointable = True
    cost_collective = "ring_allreduce"

    def __init__(self, segment_bytes: int | None = None) -> None:
        """``segment_bytes``: chunks larger than this travel in segments, pipelined (same result)."""
        if segment_bytes is not None and segment_bytes < 1:
            raise ValueError(f"segment_bytes must be None or >= 1, got {segment_bytes}")
        self.segment_bytes = segment_bytes

    def average(self, comm: Communicator, flat: np.ndarray) -> None:
        """Overwrite ``flat`` with the mean over ranks, reduced round the ring."""
        ring_allreduce_in_segments(comm, flat, self.segment_bytes)
        flat /= comm.world_size


class BuiltinAllreduce(FlatExchange):
    """The backend's own allreduce (MPI's or gloo's algorithm) on the flat gradient."""

    name = "builtin"
    checkpointable = True
    cost_collective = "ring_allreduce"

    def average(self, comm: Communicator, flat: np.ndarray) -> None:
        """Overwrite ``flat`` with the mean over ranks, reduced by the backend."""
        comm.allreduce(flat)
        flat /= comm.world_size
