"""Lecture 14: bytes per rank and step, and activation memory per rank, by formula.

Each formula is what the communicator's counters (or :mod:`course_lib.parallel.transformer.memory`)
must show for one training step of TinyGPT with ``n_layer`` blocks on ``batch`` sequences of
``length`` tokens, width ``d_model``, in float32 (4 bytes). Bytes handed to built-in
collectives are buffer bytes (what the counters count; :mod:`course_lib.comm.wire` turns them
into bytes on the link); point-to-point bytes are what this rank sent.
"""

from __future__ import annotations

from course_lib.parallel.model_parallel.tensor_parallel import shard_bounds
from course_lib.parallel.transformer.layouts import Layout, causal_pairs

__all__ = [
    "FLOAT",
    "layernorm_bytes",
    "ring_memory",
    "ring_traffic",
    "tensor_parallel_traffic",
    "ulysses_traffic",
]

FLOAT = 4  # bytes of a float32


def tensor_parallel_traffic(
    batch: int,
    length: int,
    d_model: int,
    n_layer: int,
    world_size: int,
    sequence_parallel: bool = False,
    block: int | None = None,
) -> dict[str, tuple[int, int]]:
    """Return ``{collective: (calls, buffer bytes)}`` of one step of :class:`TensorParallelGPT`.

    Tensor parallel: $4L + 2$ allreduces of $BTd$ floats (embedding, 2 per block forward, 2 per
    block and the head's input backward) and 3 of $BT$ (the vocabulary-parallel loss).
    Sequence parallel: each of the $4L + 2$ becomes a reduce-scatter handed $BTd$ and an
    allgather handed $BTd/t$; one more allreduce sums the replicated weights' gradients
    ($6d$ per block, $2d$ for the last LayerNorm and ``block`` x d for the positions).
    """
    act, loss = batch * length * d_model * FLOAT, batch * length * FLOAT
    n = 4 * n_layer + 2
    if not sequence_parallel:
        return {"allreduce": (n + 3, n * act + 3 * loss)}
    replicated = (6 * d_model * n_layer + 2 * d_model + (block or length) * d_model) * FLOAT
    return {
        "reduce_scatter": (n, n * act),
        "allgather": (n, n * act // world_size),
        "allreduce": (4, 3 * loss + replicated),
    }


def _kv_bytes(layout: Layout, rank: int, batch: int, d_model: int) -> list[int]:
    """Bytes of the key / value block of ``rank - s`` for s = 0, 1, ... (the order it is sent)."""
    p = layout.world_size
    return [2 * batch * d_model * layout.size((rank - s) % p) * FLOAT for s in range(p)]


def ring_traffic(
    layout: Layout, rank: int, batch: int, d_model: int, n_layer: int
) -> dict[str, int]:
    """Return the bytes ``rank`` sends point-to-point in one step of ring attention, per pass.

    Forward: the key / value blocks of $P - 1$ steps. Backward: those again, plus each block's
    gradient at each of $P$ steps. With equal blocks: $2BTd\\frac{P-1}{P}$ and $2BTd\\frac{2P-1}{P}$
    floats per block of the model.
    """
    kv = _kv_bytes(layout, rank, batch, d_model)
    forward = n_layer * sum(kv[:-1])
    return {"forward": forward, "backward": forward + n_layer * sum(kv)}


def ulysses_traffic(
    layout: Layout, rank: int, batch: int, n_head: int, d_model: int, n_layer: int
) -> dict[str, int]:
    """Return the bytes ``rank`` sends point-to-point in one step of Ulysses, per pass.

    Forward: q, k, v of its tokens for the other ranks' heads, then its heads' outputs for the
    other ranks' tokens. Backward: the same two all-to-alls, reversed.
    """
    p, dh = layout.world_size, d_model // n_head
    heads = [b - a for a, b in shard_bounds(n_head, p, "attention heads")]
    others = [j for j in range(p) if j != rank]
    mine_tokens = sum(heads[j] for j in others) * layout.size(rank)  # my tokens, their heads
    their_tokens = heads[rank] * sum(layout.size(j) for j in others)  # my heads, their tokens
    per_block = batch * dh * FLOAT * (3 * mine_tokens + their_tokens)
    backward = batch * dh * FLOAT * (mine_tokens + 3 * their_tokens)
    return {"forward": n_layer * per_block, "backward": n_layer * backward}


def layernorm_bytes(batch: int, tokens: int, d_model: int, n_layer: int) -> int:
    """Return the bytes the $2L + 1$ LayerNorms keep for backward on ``tokens`` tokens per sequence.

    Each keeps its input ($d$ floats per token), its mean and its reciprocal deviation (1 each).
    Tensor parallelism: ``tokens`` = $T$ on every rank; sequence parallelism: $T / t$
    (Korthikanti et al. 2022: the $10\\,sbh$ of their equation 2 that tensor parallelism does not
    divide by $t$ is divided by it).
    """
    return (2 * n_layer + 1) * batch * tokens * (d_model + 2) * FLOAT


def ring_memory(layout: Layout, rank: int, batch: int, n_head: int, d_model: int) -> dict[str, int]:
    """Return ring attention's memory for one block on ``rank``, in bytes, against one process's.

    ``saved``: q, k, v, output and log-sum-exp of its tokens, kept for backward; ``block``: the
    largest score block held at once (its largest chunk pair, all heads); ``scores``: the score
    elements it computes in all; ``full``: the $B H T^2$ probabilities an attention that
    stores them (the math kernel, Korthikanti's $5as^2b$ term) keeps in one process.
    """
    t = layout.size(rank)
    sizes = {cid: b - a for chunks in layout.chunks for cid, a, b in chunks}
    largest = max(
        (b - a) * n for qid, a, b in layout.chunks[rank] for kid, n in sizes.items() if kid <= qid
    )
    return {
        "saved": (4 * batch * t * d_model + batch * n_head * t) * FLOAT,
        "block": batch * n_head * largest * FLOAT,
        "scores": batch * n_head * causal_pairs(layout, rank) * FLOAT,
        "full": batch * n_head * layout.length**2 * FLOAT,
    }
