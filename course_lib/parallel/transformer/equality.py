"""Lecture 14: every scheme trained beside one process, with its bytes and memory against the formulas.

:func:`compare_with_one_process` builds one TinyGPT, its tensor-, sequence- or context-parallel
copy on ``comm``, and trains both 3 Adam steps on the same batches; it returns how far apart
they are (forward logits, first gradients, final weights), what the communicator counted in
the first step, the formulas for it, and the activation memory of the LayerNorm regions. The
lecture's table and the tests read the same numbers.

Adam's ``eps`` is 1e-6, not 1e-8: the key bias's gradient is zero in exact arithmetic (a
softmax ignores a shift of all of a query's scores), so both runs see only rounding noise
there, which Adam divides by $\\sqrt{v} + \\epsilon$; with 1e-8 that noise becomes steps of
about lr / 10 that differ between two runs adding in different orders.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from course_lib.comm.communicator import Communicator
from course_lib.parallel.sharded.activations import SavedBytes
from course_lib.parallel.transformer import formulas
from course_lib.parallel.transformer.context import ContextParallelGPT
from course_lib.parallel.transformer.layouts import contiguous_layout, zigzag_layout
from course_lib.parallel.transformer.memory import saved_bytes_by_region
from course_lib.parallel.transformer.ring import RingStats, ring_attention
from course_lib.parallel.transformer.tp_gpt import TensorParallelGPT
from course_lib.training.transformer import TinyGPT

__all__ = ["SCHEMES", "SMALL", "build_scheme", "compare_with_one_process", "ring_against_full"]

SCHEMES = ("tensor", "sequence", "ring", "ulysses")
#: TinyGPT small enough for the tests and the lecture: 6 heads split 2, 2, 1, 1 over 4 ranks.
SMALL = {"vocab": 23, "block": 12, "d_model": 24, "n_head": 6, "n_layer": 2}


def build_scheme(scheme: str, model: TinyGPT, comm: Communicator) -> torch.nn.Module:
    """Return this rank's part of ``model`` under ``scheme`` (one of :data:`SCHEMES`)."""
    if scheme in ("tensor", "sequence"):
        return TensorParallelGPT(model, comm, sequence_parallel=scheme == "sequence")
    if scheme in ("ring", "ulysses"):
        return ContextParallelGPT(model, comm, attention=scheme)
    raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def compare_with_one_process(
    comm: Communicator,
    scheme: str,
    length: int = 12,
    batch: int = 3,
    steps: int = 3,
    sizes: dict | None = None,
) -> dict:
    """Train ``scheme`` on ``comm`` and one TinyGPT on the same batches; return errors, bytes, memory.

    Every rank of ``comm`` calls it with the same arguments. Errors are relative: per tensor
    for the logits and gradients, to the largest weight for the weights (LayerNorm biases
    start at 0, so their own size says nothing about rounding).
    """
    sizes = {**SMALL, **(sizes or {})}
    torch.manual_seed(0)  # the same model and batches on every rank
    ref = TinyGPT(**sizes)
    net = build_scheme(scheme, ref, comm)
    X = torch.randint(0, sizes["vocab"], (steps, batch, length))
    Y = torch.randint(0, sizes["vocab"], (steps, batch, length))
    start = {n: p.detach().clone() for n, p in ref.named_parameters()}
    with torch.no_grad():
        row: dict = {"forward": _rel(net(X[0]), ref(X[0]))}
    opts = [torch.optim.Adam(m.parameters(), lr=1e-3, eps=1e-6) for m in (ref, net)]
    for step in range(steps):
        for opt in opts:
            opt.zero_grad()
        F.cross_entropy(ref(X[step]), Y[step]).backward()
        comm.stats.reset()
        net.loss(X[step], Y[step]).backward()
        net.sync_grads()
        if step == 0:
            grads = {n: p.grad for n, p in ref.named_parameters()}
            row["grad"] = max(
                _rel(p.grad, net.shard_of(n, grads)) for n, p in net.named_parameters()
            )
            row["counted"] = {k: (v.calls, v.bytes) for k, v in comm.stats.collectives.items()}
            row["sent"] = comm.stats.bytes_sent
        for opt in opts:
            opt.step()
    full = ref.state_dict()
    largest = max(w.abs().max() for w in full.values())
    row["weights"] = max(
        ((p - net.shard_of(n, full)).abs().max() / largest).item()
        for n, p in net.named_parameters()
    )
    row["moved"] = max(((full[n] - start[n]).abs().max() / largest).item() for n in start)
    d, heads, layers = sizes["d_model"], sizes["n_head"], sizes["n_layer"]
    if scheme in ("tensor", "sequence"):
        sp = scheme == "sequence"
        row["formula"] = formulas.tensor_parallel_traffic(
            batch, length, d, layers, comm.world_size, sp, sizes["block"]
        )
        row["formula_sent"] = 0
        measured = saved_bytes_by_region(net, partial(net.loss, X[0], Y[0]))
        row["layernorm"] = measured["layernorm"]
        tokens = length // comm.world_size if sp else length
        row["layernorm_formula"] = formulas.layernorm_bytes(batch, tokens, d, layers)
    else:
        row["formula"] = {"allreduce": (1, sum(p.numel() for p in ref.parameters()) * 4)}
        layout = net.layout(length)
        traffic = (
            formulas.ring_traffic(layout, comm.rank, batch, d, layers)
            if scheme == "ring"
            else formulas.ulysses_traffic(layout, comm.rank, batch, heads, d, layers)
        )
        row["formula_sent"] = traffic["forward"] + traffic["backward"]
    return row


def ring_against_full(
    comm: Communicator,
    length: int,
    layout: str = "zig-zag",
    batch: int = 2,
    n_head: int = 3,
    head_dim: int = 4,
) -> dict:
    """Run ring attention on ``comm`` beside full causal attention in one process; return this rank's numbers.

    ``error``: the largest difference of the output and of the q, k, v gradients; ``saved``:
    the bytes autograd keeps for backward (lecture 11's counter); ``stats``: the scores computed;
    ``formula``: :func:`course_lib.parallel.transformer.formulas.ring_memory`. Every rank calls it.
    """
    make = zigzag_layout if layout == "zig-zag" else contiguous_layout
    plan = make(length, comm.world_size)
    torch.manual_seed(length)  # the same q, k, v on every rank
    q, k, v = (torch.randn(batch, n_head, length, head_dim, requires_grad=True) for _ in range(3))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    g = torch.randn_like(full)
    (full * g).sum().backward()
    mine = plan.positions(comm.rank)
    local = [z.detach()[:, :, mine].clone().requires_grad_() for z in (q, k, v)]
    stats, counter = RingStats(), SavedBytes([])
    with counter.hooks():
        y = ring_attention(*local, comm, plan, stats=stats)
    (y * g[:, :, mine]).sum().backward()
    errors = [(y - full[:, :, mine]).abs().max().item()]
    errors += [
        (a.grad - b.grad[:, :, mine]).abs().max().item()
        for a, b in zip(local, (q, k, v), strict=True)
    ]
    return {
        "error": max(errors),
        "saved": counter.total,
        "scores": stats.scores * batch * n_head * formulas.FLOAT,
        "block": stats.largest_block * batch * n_head * formulas.FLOAT,
        "formula": formulas.ring_memory(plan, comm.rank, batch, n_head, n_head * head_dim),
    }
