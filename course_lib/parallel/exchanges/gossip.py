"""Lecture 6: Gossip instead of allreduce: average gradients with two partners whose distance rotates.

Source 001's Algorithm 2 (after GossipGraD, Daily et al. 2018) on device ``i``: partners
``r = (i + s) mod P`` and ``l = (i - s + P) mod P``; exchange gradients with them; step with
$(\\nabla E_l + \\nabla E_i + \\nabla E_r) / 3$; then ``s = s + 1``, back to 1 once ``s > P/2``.
Algorithm 3 sends only the components above a threshold ``t``, with their indices.

Each rank talks to two ranks per step whatever ``P`` is, so no rank waits for all the others
(there is no barrier: ``synchronises_at`` is False and a partner's lateness shows in ``comm``).
The price: the gradients are mixed, the *weights* never are, so the replicas drift apart
(measure it with ``train_data_parallel(..., measure_drift_every=k)``). Weight gossip is
Local-SGD's ``averaging="gossip"`` (:mod:`course_lib.parallel.exchanges.local_sgd`).

A presence flag per trainable tensor travels with the gradient and is mixed with it, as in the
allreduce methods (:func:`~course_lib.parallel.exchanges.base.flatten_grads`): a parameter that
neither this rank nor its two partners has a gradient for keeps ``grad = None``, as one process
leaves it (a zero gradient would let momentum move it).
"""

from __future__ import annotations

import time

import torch
from torch import nn

from course_lib.collectives.gossip import gossip_sparse_step, gossip_step, next_distance
from course_lib.comm.communicator import Communicator
from course_lib.parallel.exchanges.base import (
    GradientExchange,
    StepTimeline,
    flatten_grads,
    trainable_parameters,
    unflatten_into_grads,
)

__all__ = ["GossipExchange", "SparseGossipExchange", "check_threshold"]


def check_threshold(threshold: float) -> float:
    """Return ``threshold`` as a float; raise ValueError with advice unless it is >= 0."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or threshold < 0:
        raise ValueError(
            f"threshold={threshold!r}: give a number >= 0; components with |g| > threshold "
            "are sent (source 001 found t = 1 best for its CNN; 0 sends every nonzero)"
        )
    return float(threshold)


class GossipExchange(GradientExchange):
    """Source 001 Algorithm 2: replace each gradient by the mean of it and its two partners'."""

    name = "gossip"
    averages_every_step = False
    sends_presence_flags = True
    not_checkpointable_because = (
        "its replicas differ between averagings, so rank 0's weights are not the run's state"
    )

    def __init__(self) -> None:
        self.distance = 1  # s, the same on every rank: all ranks step in lockstep

    def synchronises_at(self, step: int) -> bool:
        """Gossip never waits for every rank: only for its two partners (inside ``comm``)."""
        return False

    def exchange(self, comm: Communicator, net: nn.Module, timeline: StepTimeline) -> None:
        """Mix this rank's gradient with its partners' at distance ``s``, then rotate ``s``."""
        params = trainable_parameters(net)
        flat = flatten_grads(params, flags=True)
        start = time.time()
        self.mix(comm, flat, len(params))
        timeline.mark("comm", start)
        unflatten_into_grads(flat, params, flags=True)
        self.distance = next_distance(self.distance, comm.world_size)

    def mix(self, comm: Communicator, flat: torch.Tensor, flags: int) -> None:
        """Overwrite ``flat`` with $(x_l + x_i + x_r) / 3$ at the current distance.

        Its last ``flags`` components are the presence flags, mixed like the values.
        """
        gossip_step(comm, flat, self.distance)


class SparseGossipExchange(GossipExchange):
    """Source 001 Algorithm 3: as gossip, but only components with ``|g| > threshold`` travel.

    Every rank's gradient becomes $(\\hat g_l + \\hat g_i + \\hat g_r) / 3$ where $\\hat g$ is zero
    below the threshold, so with plain SGD (source 001: no momentum) only the weights at the
    sent indices change; with momentum the optimiser's velocity still moves the others. The
    step's record gets ``values_sent`` (components this rank sent, to each partner) and
    ``values_total`` (the gradient's size): source 001's "95 % fewer values" is
    ``1 - values_sent / values_total``. The presence flags that are set travel too, whatever the
    threshold (``flags_sent`` of them, 8 bytes each like a value).
    """

    name = "gossip_sparse"

    def __init__(self, threshold: float = 1.0) -> None:
        super().__init__()
        self.threshold = check_threshold(threshold)
        self._timeline: StepTimeline | None = None

    def exchange(self, comm: Communicator, net: nn.Module, timeline: StepTimeline) -> None:
        """Mix the above-threshold components with the partners'; note how many were sent."""
        self._timeline = timeline
        super().exchange(comm, net, timeline)

    def mix(self, comm: Communicator, flat: torch.Tensor, flags: int) -> None:
        """Overwrite ``flat`` with the mean of the three sparsified gradients (and flags)."""
        values = flat[: flat.numel() - flags]
        sent = int((values.abs() > self.threshold).sum())
        flags_sent = int((flat[values.numel() :] != 0).sum())
        gossip_sparse_step(comm, flat, self.distance, self.threshold, flags=flags)
        if self._timeline is not None:
            self._timeline.note("values_sent", sent)
            self._timeline.note("flags_sent", flags_sent)
            self._timeline.note("values_total", values.numel())
