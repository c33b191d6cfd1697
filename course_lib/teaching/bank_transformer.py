"""Lectures 14 and 15: the questions at the end of each lecture; numeric answers computed by the lecture's own formulas."""

from __future__ import annotations

import math

import torch

from course_lib.comm.wire import collective_wire_bytes
from course_lib.parallel.experts.expert_parallel import moe_step_bytes
from course_lib.parallel.experts.gating import capacity, route
from course_lib.parallel.grid.mesh import grid_lines
from course_lib.parallel.transformer.formulas import (
    layernorm_bytes,
    ring_traffic,
    tensor_parallel_traffic,
    ulysses_traffic,
)
from course_lib.parallel.transformer.layouts import (
    causal_pairs,
    contiguous_layout,
    zigzag_layout,
)
from course_lib.teaching.questions import Numeric, Question, choice

__all__ = ["TRANSFORMER"]

#: Lecture 14's TinyGPT: batch 3, T = 12 tokens, d = 24, L = 2 blocks.
_B, _T, _D, _L = 3, 12, 24, 2


def _lecture14() -> list[Question]:
    allreduces = tensor_parallel_traffic(_B, _T, _D, _L, 4)["allreduce"][0] - 3  # less the loss's
    act = _B * _T * _D * 4
    on_gloo = (
        collective_wire_bytes("reduce_scatter", act, 4, "gloo")
        + collective_wire_bytes("allgather", act // 4, 4, "gloo")
    ) / collective_wire_bytes("allreduce", act, 4, "gloo")
    busiest = causal_pairs(contiguous_layout(64, 4), 3) / causal_pairs(zigzag_layout(64, 4), 3)
    layout = contiguous_layout(16, 4)  # equal blocks, 4 heads: one per rank
    ulysses_vs_ring = (
        ulysses_traffic(layout, 0, 1, 4, 16, 1)["forward"] / ring_traffic(layout, 0, 1, 16, 1)["forward"]
    )  # fmt: skip
    return [
        Numeric("14.q1", f"Tensor parallelism of a TinyGPT of L = {_L} blocks: how many allreduces "
                "of B x T x d floats per training step (the loss's three small ones not counted)?",
                float(allreduces), "4L + 2: the embedding, 2 per block forward, 2 per block "
                "backward and the head's input", rel_tol=1e-9),
        Numeric("14.q2", "Sequence parallelism on t = 4 ranks: the bytes the LayerNorms keep for "
                "backward, as a share of tensor parallelism's?",
                layernorm_bytes(_B, _T // 4, _D, _L) / layernorm_bytes(_B, _T, _D, _L),
                "each rank keeps the LayerNorm regions of T / t tokens, not T", rel_tol=1e-6),
        choice("14.q3", "On a ring of t ranks (MPI's algorithms), a reduce-scatter of S bytes and "
               "an allgather of S / t per rank, against one allreduce of S, put on each link ...",
               ("the same bytes", "half the bytes", "twice the bytes"), 0,
               "(t - 1) / t S each, 2 (t - 1) / t S together: what the allreduce sends"),
        Numeric("14.q4", "The kit's gloo backend runs a reduce-scatter as an allreduce: on 4 "
                "ranks, sequence parallelism's reduce-scatter + allgather put how many times an "
                "allreduce's bytes on the wire?", on_gloo,
                "the wire model of course_lib.comm.wire: 2(t-1)/t S + (t-1)/t S over 2(t-1)/t S"),
        Numeric("14.q5", "Causal ring attention, T = 64 on 4 ranks: the scores per head of the "
                "busiest rank with contiguous blocks, as a multiple of a zig-zag rank's?",
                busiest, "P blocks of (T/P)^2 against 2P + 1 chunk pairs of (T/2P)^2: 16/9"),
        Numeric("14.q6", "Online softmax: a query's running maximum is m = 2 and a new block of "
                "keys brings a score of 4. By what factor are its running sum and output "
                "multiplied?", math.exp(2 - 4), "e^(m - m'): the old terms re-expressed "
                "against the new maximum"),
        Numeric("14.q7", "Equal blocks on P = 4 ranks, as many heads as ranks: Ulysses' forward "
                "bytes per rank, as a share of ring attention's?", ulysses_vs_ring,
                "4BTd (P-1)/P^2 against 2BTd (P-1)/P: 2/P"),
        choice("14.q8", "What limits how many ranks DeepSpeed-Ulysses can use?",
               ("the number of attention heads (P <= H)", "the sequence length (P <= T)",
                "nothing: it scales like ring attention"), 0,
               "after the all-to-all every rank holds whole heads: at least one each"),
    ]  # fmt: skip


def _lecture15() -> list[Question]:
    wanted = (17, 19, 12, 16)  # the lecture's 32 tokens, k = 2, first and second choices
    full = capacity(32, 4, 2, 1.0)
    skewed = torch.zeros(64, 8)
    skewed[:, 0] = 30.0  # every token's router all but certain of expert 0
    data_line = next(line for line in grid_lines((2, 2), 0) if 1 in line)
    return [
        Numeric("15.q1", "All-to-all on N = 4 ranks: the share of its buffer each rank sends?",
                (4 - 1) / 4, "each rank keeps its own block and sends the other N - 1",
                rel_tol=1e-9),
        Numeric("15.q2", "Capacity factor 1.25, 32 tokens, 4 experts, k = 2: slots per expert?",
                float(capacity(32, 4, 2, 1.25)), "ceil(f k T / E)", rel_tol=1e-9),
        Numeric("15.q3", f"Capacity factor 1.0 (so {full} slots), and the 32 tokens' 64 choices "
                f"want the 4 experts {list(wanted)} times: how many choices are dropped?",
                float(sum(max(0, w - full) for w in wanted)),
                "every choice beyond an expert's capacity is dropped", rel_tol=1e-9),
        Numeric("15.q4", "Switch's load-balancing loss (alpha = 1) when 8 experts' router sends "
                "all 64 tokens to expert 0 with probability about 1?",
                float(route(skewed, 1, 8).aux_loss), "E sum f_e P_e = E x 1 x 1; it is 1 "
                "when routing is uniform"),
        Numeric("15.q5", "Expert parallelism: E = 4 experts on 4 ranks, capacity 12, d = 16, "
                "float32, a layer fed by data: bytes each rank sends per training step?",
                moe_step_bytes(4, 12, 16, 4, input_needs_grad=False),
                "3 all-to-alls of E C d floats, (N - 1)/N of each", unit="B"),
        choice("15.q6", "A token whose expert is already full ...",
               ("skips the layer: it passes by the residual connection",
                "waits for the next step", "goes to the least loaded expert"), 0,
               "Switch and GShard drop it; fixed buffers keep the all-to-all's size fixed"),
        choice("15.q7", "A 2 x 2 grid (data x expert, ranks row-major): which ranks form rank 1's "
               "`data` sub-communicator?",
               (f"ranks {data_line[0]} and {data_line[1]}", "ranks 0 and 1", "all four ranks"),
               0, "along data the expert coordinate is fixed: rank 1 and the rank 2 further on"),
        choice("15.q8", "Compared with an allreduce, an all-to-all ...",
               ("adds nothing and copies nothing: each block travels once to its addressee",
                "sums the blocks of every rank", "sends every block to every rank"), 0,
               "it is a transpose of blocks"),
    ]  # fmt: skip


TRANSFORMER: dict[int, list[Question]] = {14: _lecture14(), 15: _lecture15()}
