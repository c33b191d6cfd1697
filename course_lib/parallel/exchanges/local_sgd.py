"""Lecture 5: Local-SGD(p): every rank steps on its own gradients and the *weights* are averaged every p steps.

Source 001, Algorithm 1, after Yu et al. 2018 ("Parallel restarted SGD"): between
synchronisations the replicas train alone, so communication falls by a factor ``p``; they
drift apart meanwhile, and the averaging pulls them back. ::

    train_data_parallel(cluster, ..., method="local_sgd", period=16)
    train_data_parallel(cluster, ..., method="local_sgd", period=16, averaging="gossip_sparse",
                        threshold=1e-3)

**Order of averaging and step** (``order``). The digest writes Algorithm 1 as
$w_{k,i} = \\bar w - \\eta \\nabla E_i(w_{k-1,i})$ with $\\bar w$ the mean of the $w_{k-1,j}$:
the gradient is taken at the local weights, averaging happens before the step
(``order="average_then_step"``, run in :meth:`exchange`). Yu et al., whose convergence
condition ($p = O(T^{1/4} / N^{3/4})$: a scaling, not a number) source 001 cites, step first
and average after (``order="step_then_average"``, the default, run in :meth:`after_step`):
then Local-SGD(1) *is* bulk-synchronous SGD (the mean of the stepped weights equals the step
with the mean gradient), while the literal order leaves the replicas one local step apart after
every averaging.

**Averaging** (``averaging``): ``"allreduce"`` (the backend's allreduce of the weights, then
divide by P; the recorder times the wait before it); ``"gossip"`` (one gossip step of the
weights with the rotating partner, source 001 configurations 5 and 8); ``"gossip_sparse"``
(configurations 6 and 9: each rank sends only the weights that moved by more than
``threshold`` since its last synchronisation, with their indices; a partner's weight that was
not sent counts as equal to one's own, so only sent indices change). For ``period=1`` the
gossip variants are source 001's Algorithms 2 and 3 literally: they mix *gradients* every step
(:mod:`course_lib.parallel.exchanges.gossip`), which is what its configurations 2 and 3 ran.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from course_lib.collectives.gossip import gossip_sparse_exchange, gossip_step, next_distance
from course_lib.comm.communicator import Communicator
from course_lib.parallel.exchanges.base import GradientExchange, StepTimeline, trainable_parameters
from course_lib.parallel.exchanges.gossip import (
    GossipExchange,
    SparseGossipExchange,
    check_threshold,
)

__all__ = ["AVERAGINGS", "ORDERS", "LocalSGD", "average_weights_sparse"]

AVERAGINGS = ("allreduce", "gossip", "gossip_sparse")
ORDERS = ("step_then_average", "average_then_step")


def average_weights_sparse(
    comm: Communicator, flat: np.ndarray, reference: np.ndarray, s: int, threshold: float
) -> int:
    """Gossip the weights of ``flat`` that moved more than ``threshold`` from ``reference``.

    In place: at each index a partner sent, $w_i \\leftarrow w_i + (w_p - w_i) / 3$ (a partner
    that did not send it is taken to agree); every other index keeps its value. Returns how
    many components this rank sent to each partner.
    """
    index = np.flatnonzero(np.abs(flat - reference) > threshold).astype(np.int32)
    values = flat[index].copy()
    own = flat.copy()
    for idx_in, val_in in gossip_sparse_exchange(comm, index, values, s):
        np.add.at(flat, idx_in, (val_in - own[idx_in]) / 3)
    return int(index.size)


class LocalSGD(GradientExchange):
    """Local-SGD(p) of source 001: gradients stay local, weights averaged every ``period`` steps."""

    name = "local_sgd"
    averages_every_step = False
    not_checkpointable_because = (
        "its replicas differ between averagings, so rank 0's weights are not the run's state"
    )

    def __init__(
        self,
        period: int = 1,
        averaging: str = "allreduce",
        threshold: float = 1.0,
        order: str = "step_then_average",
    ) -> None:
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise ValueError(
                f"period={period!r}: give the number of local steps between averagings, an "
                "int >= 1 (1 = bulk-synchronous; source 001 ran 1, 4, 16 and 32)"
            )
        if averaging not in AVERAGINGS:
            raise ValueError(f"averaging={averaging!r}: choose one of {', '.join(AVERAGINGS)}")
        if order not in ORDERS:
            raise ValueError(
                f"order={order!r}: choose 'step_then_average' (Yu et al. 2018; Local-SGD(1) = "
                "bulk-synchronous) or 'average_then_step' (source 001's Algorithm 1 as written)"
            )
        self.period, self.averaging, self.order = period, averaging, order
        self.threshold = check_threshold(threshold)
        self.distance = 1
        self.steps_done = 0
        self._reference: np.ndarray | None = None  # weights after the last synchronisation
        self.gradient_gossip: GossipExchange | None = None
        if period == 1 and averaging == "gossip":
            self.gradient_gossip = GossipExchange()
        elif period == 1 and averaging == "gossip_sparse":
            self.gradient_gossip = SparseGossipExchange(threshold)
        self.sync_point = "after_step" if order == "step_then_average" else "exchange"

    def synchronises_at(self, step: int) -> bool:
        """True at the steps that average with an allreduce: every ``period``-th (gossip: never)."""
        return self.averaging == "allreduce" and (step + 1) % self.period == 0

    def flag_bytes(self, tensors: int) -> int:
        """Return the presence flags' bytes: gradient gossip (period 1) sends them, weights none."""
        return 0 if self.gradient_gossip is None else self.gradient_gossip.flag_bytes(tensors)

    def _averages_at(self, step: int) -> bool:
        return self.gradient_gossip is None and (step + 1) % self.period == 0

    def exchange(self, comm: Communicator, net: nn.Module, timeline: StepTimeline) -> None:
        """Leave the gradients local (or gossip them, period 1); average first if so ordered."""
        if self.gradient_gossip is not None:
            self.gradient_gossip.exchange(comm, net, timeline)
        elif self.order == "average_then_step" and self._averages_at(self.steps_done):
            self.average(comm, net, timeline)

    def after_step(
        self, comm: Communicator, net: nn.Module, step: int, timeline: StepTimeline
    ) -> None:
        """Average the weights after every ``period``-th step (order ``step_then_average``)."""
        if self.order == "step_then_average" and self._averages_at(step):
            self.average(comm, net, timeline)
        self.steps_done = step + 1

    def average(self, comm: Communicator, net: nn.Module, timeline: StepTimeline) -> None:
        """Replace the trainable weights by their average (allreduce or one gossip step)."""
        if comm.world_size == 1:
            return
        params = trainable_parameters(net)
        start = time.time()
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1).float() for p in params])
            arr = flat.numpy()
            if self.averaging == "allreduce":
                comm.allreduce(arr)
                arr /= comm.world_size
            elif self.averaging == "gossip":
                gossip_step(comm, arr, self.distance)
            else:
                if self._reference is None:  # every replica started from rank 0's weights
                    self._reference = self._initial.copy()
                sent = average_weights_sparse(
                    comm, arr, self._reference, self.distance, self.threshold
                )
                self._reference = arr.copy()
                timeline.note("values_sent", sent)
                timeline.note("values_total", arr.size)
            offset = 0
            for p in params:
                p.copy_(flat[offset : offset + p.numel()].view_as(p).to(p.dtype))
                offset += p.numel()
        if self.averaging != "allreduce":
            self.distance = next_distance(self.distance, comm.world_size)
        timeline.mark("sync", start)

    def attach(self, comm: Communicator, net: nn.Module) -> nn.Module:
        """Remember the starting weights (the first reference of sparse gossip)."""
        params = trainable_parameters(net)
        with torch.no_grad():
            self._initial = torch.cat([p.detach().reshape(-1).float() for p in params]).numpy()
        return net

    def __repr__(self) -> str:
        extra = f", t={self.threshold:g}" if self.averaging == "gossip_sparse" else ""
        return f"<LocalSGD p={self.period} {self.averaging}{extra} {self.order}>"
