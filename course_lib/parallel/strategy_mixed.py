"""Lecture 13: A strategy the search found, mixing configurations operator by operator, run on the engines.

FlexFlow's search (source 003) picks a configuration per operator; its evidence is that the
strategies it finds run faster. Lecture 13's search on SmallCNN picks the convolutions split by
samples and the dense head replicated on every worker (each computes the head on the whole batch,
so the head's gradients need no allreduce: duplicated arithmetic traded for a message).
:func:`run_configs` runs any strategy of a chain in which every operator is either split by
samples over all workers or replicated on all of them, with the messages the simulator's task
graph puts on its links (:mod:`course_lib.cost_model.task_graph`):

- sample → replicated: every worker sends its rows of the activation to every other (forward);
  backward, each keeps its own rows of the whole gradient it computed (no message);
- replicated → sample: each keeps its rows (forward, no message); backward, every worker sends
  its rows' gradient to every other, so the replicated operator sees the whole gradient;
- a replicated loss receives the labels the other workers loaded;
- after the backward pass, one ring allreduce of the gradients of the sample-split operators'
  weights (``sync="after_backward"``); a replicated operator's gradients are already whole.

:func:`runnable` says why a strategy is outside this family (then the lecture runs the best
strategy of the family instead and says so).
"""

from __future__ import annotations

from typing import Any

from course_lib.cost_model.configs import ParallelConfig

__all__ = ["run_configs", "runnable"]

_ACT_TAG, _GRAD_TAG = 8090, 8091  # below the collectives (8100-8112) and the strategies (8113-8191)


def runnable(configs: tuple[ParallelConfig, ...], world_size: int) -> str | None:
    """Return None when :func:`run_configs` can run ``configs``, else the reason in one line."""
    every = tuple(range(world_size))
    for i, cfg in enumerate(configs):
        if cfg.split not in ("sample", "replicate") or tuple(cfg.devices) != every:
            return (
                f"operator {i} is {cfg}: the engines here run sample splits and replicas "
                f"over all {world_size} workers only"
            )
    return None


def _exchange_rows(comm, own, tag: int):
    """Send ``own`` rows to every other rank and return every rank's rows, in rank order."""
    import torch

    own = own.contiguous()
    handles = [comm.isend(own, dst, tag) for dst in range(comm.world_size) if dst != comm.rank]
    parts = [
        own if src == comm.rank else comm.recv(torch.empty_like(own), src, tag)
        for src in range(comm.world_size)
    ]
    for h in handles:
        h.wait()
    return torch.cat(parts)


def _functions():
    import torch

    class ToWhole(torch.autograd.Function):
        """Forward: gather every rank's rows; backward: keep this rank's rows of the gradient."""

        @staticmethod
        def forward(ctx, x, comm):
            ctx.rows, ctx.rank = len(x), comm.rank
            return _exchange_rows(comm, x.detach(), _ACT_TAG)

        @staticmethod
        def backward(ctx, grad):
            a = ctx.rank * ctx.rows
            return grad[a : a + ctx.rows].contiguous(), None

    class ToOwn(torch.autograd.Function):
        """Forward: keep this rank's rows; backward: gather every rank's rows of the gradient."""

        @staticmethod
        def forward(ctx, x, comm):
            ctx.comm = comm
            n = len(x) // comm.world_size
            return x[comm.rank * n : (comm.rank + 1) * n].clone()

        @staticmethod
        def backward(ctx, grad):
            return _exchange_rows(ctx.comm, grad, _GRAD_TAG), None

    return ToWhole, ToOwn


def run_configs(
    configs: tuple[ParallelConfig, ...],
    comm_name: str,
    model: str,
    batch: int,
    steps: int = 5,
    seed: int = 0,
    *,
    lr: float = 0.0,
) -> dict[str, Any]:
    """Run 1 warm-up + ``steps`` steps of a sample/replicate mixture; every engine calls it.

    Returns what :func:`~course_lib.parallel.strategy_runs.run_strategy` returns: this rank's wall
    seconds per step, its last step's phases, bytes and messages, and (with ``lr > 0``, plain
    SGD) its whole copy of the weights.
    """
    import torch
    from IPython import get_ipython
    from torch import nn

    from course_lib.collectives.ring import ring_allreduce
    from course_lib.parallel.strategy_runs import _Phases
    from course_lib.parallel.strategy_weights import make_optimizer, pieces, problem

    comm = get_ipython().user_ns[comm_name]
    p, r = comm.world_size, comm.rank
    graph, net, X, y = problem(model, batch, seed)
    configs = tuple(configs)
    if len(configs) != len(graph.ops) or len(net) != len(graph.ops) - 1:
        raise ValueError(f"give one configuration per operator of {model}: {len(graph.ops)}")
    reason = runnable(configs, p)
    if reason:
        raise ValueError(reason)
    if batch % p:
        raise ValueError(
            f"a batch of {batch} does not split over {p} engines; use a multiple of {p}"
        )
    ToWhole, ToOwn = _functions()
    own = slice(r * batch // p, (r + 1) * batch // p)
    X_own, y_own = X[own].contiguous(), y[own].contiguous()
    split = [cfg.split == "sample" for cfg in configs]
    synced = [q for i, layer in enumerate(net) if split[i] for q in layer.parameters()]
    opt = make_optimizer("sgd", net.parameters(), lr) if lr > 0 else None
    walls, clock, sent, messages = [], None, 0, 0
    for step in range(steps + 1):
        comm.barrier()
        clock, before = _Phases(), (comm.stats.bytes_sent, comm.stats.messages_sent)
        net.zero_grad(set_to_none=True)
        with clock.note("forward"):
            h, sampled = X_own, True  # every rank starts with the rows it loaded
            for i, layer in enumerate(net):
                if split[i] != sampled:
                    h = (ToOwn if split[i] else ToWhole).apply(h, comm)
                    sampled = split[i]
                h = layer(h)
            if split[-1]:  # the loss on this rank's rows: its share of the global mean
                if not sampled:
                    h = ToOwn.apply(h, comm)
                loss = nn.functional.cross_entropy(h, y_own, reduction="sum") / batch
            else:  # a replicated loss needs every rank's labels
                if sampled:
                    h = ToWhole.apply(h, comm)
                labels = _exchange_rows(comm, y_own, _ACT_TAG)
                loss = nn.functional.cross_entropy(h, labels)
        with clock.note("backward"):
            loss.backward()
        if synced and p > 1:
            with clock.note("allreduce"):
                flat = torch.cat([q.grad.reshape(-1) for q in synced])
                ring_allreduce(comm, flat)  # each rank's share of one global mean: a sum
                offset = 0
                for q in synced:
                    q.grad.copy_(flat[offset : offset + q.numel()].view_as(q))
                    offset += q.numel()
        if opt is not None:
            with clock.note("update"):
                opt.step()
        wall = clock.now()
        sent = comm.stats.bytes_sent - before[0]
        messages = comm.stats.messages_sent - before[1]
        if step:
            walls.append(wall)
    out = {"walls": walls, "phases": sorted(clock.items), "bytes_sent": sent,
           "messages_sent": messages, "ledger": {}}  # fmt: skip
    if lr > 0:
        out["weights"] = pieces("data parallel", net, net, r, 0)
    return out
