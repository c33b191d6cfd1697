"""Lecture 13: A CNN's convolutions split by image height over ranks, with halo exchanges (source 003).

FlexFlow's *attribute* dimension (source 003): an operator on images can be cut along an
attribute of its samples, such as the image height. Rank ``r`` computes output rows
``[r H/N, (r+1) H/N)`` of every convolution, ReLU and pooling for *all* samples of the batch.
A ``k x k`` convolution's band needs ``k // 2`` rows beyond its own from each neighbour: the
**halo**, exchanged before the layer; in backward the halo rows' gradients go back to the rank
that owns those rows and are added there. After the last pooling every rank gathers all the
bands (each rank then holds the whole feature map) and runs the dense head whole, on the whole
batch (replicated: identical gradients, nothing to exchange); the convolutions' weights are
replicated with partial gradients (each rank's rows), summed with one ring allreduce.

Which rows each rank needs is the simulator's own arithmetic
(:func:`course_lib.cost_model.configs.in_boxes`), so the messages here are the messages the
simulator puts on its links, one per pair of ranks and direction.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.collectives.ring import ring_allreduce
from course_lib.comm.communicator import Communicator
from course_lib.cost_model.configs import ParallelConfig, check_config, in_boxes, out_boxes
from course_lib.cost_model.operators import OperatorGraph

__all__ = ["HeightSplitCNN", "height_split_step"]

_HALO_TAG, _GRAD_TAG, _BAND_TAG = 8115, 8116, 8118  # clear of the collectives and the probe 8117


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int] | None:
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if hi > lo else None


class _Halo(torch.autograd.Function):
    """Rows ``held`` of every rank -> rows ``need`` of this rank; backward sums halo gradients."""

    @staticmethod
    def forward(ctx, x, comm: Communicator, held: list, need: list) -> torch.Tensor:
        r, n = comm.rank, comm.world_size
        ctx.comm, ctx.held, ctx.need = comm, held, need
        sends = []
        for q in range(n):
            rows = _overlap(need[q], held[r]) if q != r else None
            if rows:
                piece = x[:, :, rows[0] - held[r][0] : rows[1] - held[r][0]].contiguous()
                sends.append(comm.isend(piece, q, _HALO_TAG))
        parts = []
        for q in range(n):  # bands are in rank order, so the needed rows come out in order
            rows = _overlap(need[r], held[q])
            if rows is None:
                continue
            if q == r:
                parts.append(x[:, :, rows[0] - held[r][0] : rows[1] - held[r][0]])
            else:
                buf = torch.empty((x.shape[0], x.shape[1], rows[1] - rows[0], x.shape[3]))
                parts.append(comm.recv(buf, q, _HALO_TAG))
        for handle in sends:
            handle.wait()
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad):
        comm, held, need = ctx.comm, ctx.held, ctx.need
        r, n = comm.rank, comm.world_size
        out = torch.zeros((grad.shape[0], grad.shape[1], held[r][1] - held[r][0], grad.shape[3]))
        sends = []
        for q in range(n):
            rows = _overlap(need[r], held[q])
            if rows is None:
                continue
            piece = grad[:, :, rows[0] - need[r][0] : rows[1] - need[r][0]]
            if q == r:
                out[:, :, rows[0] - held[r][0] : rows[1] - held[r][0]] += piece
            else:  # a halo row's gradient goes back to its owner
                sends.append(comm.isend(piece.contiguous(), q, _GRAD_TAG))
        for q in range(n):
            rows = _overlap(need[q], held[r]) if q != r else None
            if rows:
                buf = torch.empty((grad.shape[0], grad.shape[1], rows[1] - rows[0], grad.shape[3]))
                out[:, :, rows[0] - held[r][0] : rows[1] - held[r][0]] += comm.recv(
                    buf, q, _GRAD_TAG
                )
        for handle in sends:
            handle.wait()
        return out, None, None, None


class _Bands(torch.autograd.Function):
    """Every rank's band of rows -> the whole map on every rank; backward keeps own rows."""

    @staticmethod
    def forward(ctx, x, comm: Communicator, bands: list) -> torch.Tensor:
        r = comm.rank
        ctx.band, ctx.comm = bands[r], comm
        sends = [comm.isend(x.contiguous(), q, _BAND_TAG) for q in range(comm.world_size) if q != r]
        parts = [
            x
            if q == r
            else comm.recv(torch.empty((x.shape[0], x.shape[1], b - a, x.shape[3])), q, _BAND_TAG)
            for q, (a, b) in enumerate(bands)
        ]
        for handle in sends:
            handle.wait()
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.band  # every rank ran the same head on the same map: identical gradients
        return grad[:, :, a:b], None, None


class HeightSplitCNN(nn.Module):
    """This rank's part of a Sequential CNN: a band of image rows of every layer before the
    Flatten, the whole dense head; built from the same ``net`` (same seed) on every rank.
    ``graph`` is ``net``'s operator graph (the rows each rank needs come from its shapes)."""

    def __init__(self, net: nn.Sequential, graph: OperatorGraph, comm: Communicator) -> None:
        super().__init__()
        layers = list(net)
        flat = next((i for i, m in enumerate(layers) if isinstance(m, nn.Flatten)), None)
        if flat is None or not any(isinstance(m, nn.Conv2d) for m in layers[:flat]):
            raise ValueError(
                f"{type(net).__name__} has no convolutions before an nn.Flatten: a height split "
                "needs a CNN like course_lib.training.models.SmallCNN or LeNet"
            )
        self.comm, self.flat = comm, flat
        self.convs = nn.ModuleList(copy.deepcopy(layers[:flat]))
        self.head = nn.Sequential(*copy.deepcopy(layers[flat:]))
        devices = tuple(range(comm.world_size))
        cfg = ParallelConfig("attribute", devices)
        self.need, self.held, self.out = [], [], []
        for op in graph.ops[:flat]:  # check_config names the fix when a height does not split
            check_config(op, cfg, graph.batch, comm.world_size)
            self.need.append([box[2] for _, box in in_boxes(op, cfg, graph.batch)])
            self.out.append([box[2] for _, box in out_boxes(op, cfg, graph.batch)])
            self.held.append(self.out[-2] if len(self.out) > 1 else None)
        self.ops = graph.ops[:flat]

    def band(self, j: int, x: torch.Tensor) -> torch.Tensor:
        """Return layer ``j``'s output rows of this rank from its input rows ``need[j]``."""
        m, op, r = self.convs[j], self.ops[j], self.comm.rank
        if not isinstance(m, nn.Conv2d):
            return m(x)
        (n0, n1), (o0, o1) = self.need[j][r], self.out[j][r]
        k, p, s = op.attrs
        top, bottom = n0 - (o0 * s - p), (o1 - 1) * s - p + k - n1  # zeros at the image's edge
        return F.conv2d(F.pad(x, (0, 0, top, bottom)), m.weight, m.bias, s, (0, p))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the logits of the whole batch from this rank's input rows ``need[0]``."""
        for j in range(len(self.convs)):
            if j:
                x = _Halo.apply(x, self.comm, self.held[j], self.need[j])
            x = self.band(j, x)
        return self.head(_Bands.apply(x, self.comm, self.out[-1]))


def _exchange_rows(comm: Communicator, X_own: torch.Tensor, need: list) -> torch.Tensor:
    """Return the input rows ``need[rank]`` of every sample, from each rank's own samples."""
    r = comm.rank
    sends = [
        comm.isend(X_own[:, :, a:b].contiguous(), q, _BAND_TAG)
        for q, (a, b) in enumerate(need)
        if q != r
    ]
    a, b = need[r]
    parts = [
        X_own[:, :, a:b]
        if q == r
        else comm.recv(
            torch.empty((len(X_own), X_own.shape[1], b - a, X_own.shape[3])), q, _BAND_TAG
        )
        for q in range(comm.world_size)
    ]
    for handle in sends:
        handle.wait()
    return torch.cat(parts)


def height_split_step(model: HeightSplitCNN, X_own: torch.Tensor, y_own: torch.Tensor) -> float:
    """Run forward and backward of one step; leave every gradient equal to one process's.

    Every rank calls it with its own equal share of the samples; the loss is the mean over the
    whole batch. Gradients are set, not accumulated. Returns the loss.
    """
    comm = model.comm
    model.zero_grad(set_to_none=True)
    x = _exchange_rows(comm, X_own, model.need[0])
    y = torch.cat(_labels(comm, y_own))
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    params = list(model.convs.parameters())
    flat = torch.cat([q.grad.reshape(-1) for q in params])
    ring_allreduce(comm, flat)  # a SUM: each rank's rows hold its share of the whole mean
    offset = 0
    for q in params:
        q.grad.copy_(flat[offset : offset + q.numel()].view_as(q))
        offset += q.numel()
    return float(loss.detach())


def _labels(comm: Communicator, y_own: torch.Tensor) -> list[torch.Tensor]:
    """Return every rank's labels in rank order (each rank sends its own to every other)."""
    r = comm.rank
    sends = [comm.isend(y_own, q, _BAND_TAG) for q in range(comm.world_size) if q != r]
    parts = [
        y_own if q == r else comm.recv(torch.empty_like(y_own), q, _BAND_TAG)
        for q in range(comm.world_size)
    ]
    for handle in sends:
        handle.wait()
    return parts
