"""A9.2's judge: ring attention's forward against full causal attention, and the ring's bytes.

The engines return data (:mod:`course_grader.assignments.a9.collect`); the judge rebuilds the
whole sequence from the same seed and computes causal softmax attention over it in float64 in
one process (scores $qk^\\top/\\sqrt d$, key $j$ seen by query $i$ iff $j \\le i$), then holds
each rank's output against its rows. Right numbers are not enough: the counters must show a
ring (Liu et al. 2023) — this rank sends only to $r + 1$ and hears only from $r - 1$, no built-in
collective, and exactly the bytes of $N - 1$ key / value blocks, the blocks of ranks
$r, r - 1, \\dots$ in the order they pass (uneven with $T \\bmod N \\ne 0$), as the library's
formula counts them (:func:`course_lib.parallel.transformer.formulas.ring_traffic`). A wrong
output is compared with the usual mistakes (the mask missing, on the wrong blocks or reversed,
softmax without rescaling by the running max, scores not scaled) and the verdict names the match.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from course_grader.assignments.a9.collect import p2p_of, sequence, used_of
from course_lib.comm.buffers import chunk_bounds
from course_lib.i18n import N_, _
from course_lib.parallel.transformer.formulas import ring_traffic
from course_lib.parallel.transformer.layouts import contiguous_layout

__all__ = ["RING_CASES", "a9_ring_cases", "attention", "judge_ring"]

#: (T, heads, d) on 3 ranks: 11 tokens cut 4, 4, 3 and 16 cut 6, 5, 5 (uneven T / N)
RING_CASES = ((11, 2, 4), (16, 1, 8))


def a9_ring_cases(seed: int | None = None) -> list[dict]:
    """A9.2's cases (``seed`` None: the notebook's own)."""
    base = 92 if seed is None else (int(seed) * 1_000_003 + 92) % 2**40
    return [
        {"kind": "ring", "T": T, "heads": h, "d": d, "seed": base + i}
        for i, (T, h, d) in enumerate(RING_CASES)
    ]


def _masks(T: int, n: int) -> dict[str, np.ndarray]:
    """Which keys (columns) each query (row) attends: the right mask and the usual wrong ones."""
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    owner = np.zeros(T, int)
    local = np.zeros(T, int)
    for r, (a, b) in enumerate(chunk_bounds(T, n)):
        owner[a:b], local[a:b] = r, np.arange(b - a)
    qr, kr = owner[:, None], owner[None, :]
    return {
        "causal": j <= i,
        "none": np.ones((T, T), bool),
        "diagonal_whole": kr <= qr,
        "later_blocks": (kr != qr) | (j <= i),
        "every_block": (kr <= qr) & (local[None, :] <= local[:, None]),
        "reversed": j >= i,
    }


def attention(q: Any, k: Any, v: Any, mask: np.ndarray, scale: bool = True) -> np.ndarray:
    """Softmax attention of every query over the keys ``mask`` allows, in float64."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) * (q.shape[-1] ** -0.5 if scale else 1.0)
    s = np.where(mask, s, -np.inf)
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ v


def _no_rescale(q: Any, k: Any, v: Any, T: int, n: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s rows by the ring without rescaling: blocks r, r - 1, ..., 0 in turn, each
    block's exp(s - m) summed under the running maximum of the moment, the old sums kept as they are."""
    bounds = chunk_bounds(T, n)
    lo, hi = bounds[rank]
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    causal = _masks(T, n)["causal"]
    m = np.full((q.shape[0], hi - lo), -np.inf)
    ell, acc = np.zeros_like(m), np.zeros((q.shape[0], hi - lo, v.shape[-1]))
    for src in range(rank, -1, -1):
        a, b = bounds[src]
        s = q[:, lo:hi] @ np.swapaxes(k[:, a:b], -1, -2) * q.shape[-1] ** -0.5
        s = np.where(causal[lo:hi, a:b], s, -np.inf)
        m = np.maximum(m, s.max(-1))
        e = np.exp(s - m[..., None])
        ell, acc = ell + e.sum(-1), acc + e @ v[:, a:b]
    return acc / ell[..., None]


_MISTAKES = {
    "none": N_(
        "the causal mask is missing: every query attended to every key, later ones "
        "included (query i sees keys j <= i only)"
    ),
    "diagonal_whole": N_(
        "this rank's own block was attended whole: on the diagonal block the "
        "keys after each query (above the diagonal) must be masked"
    ),
    "later_blocks": N_(
        "the mask is on the wrong blocks: the blocks of later ranks (src > rank) "
        "were attended, though every key in them comes after every query here; skip them"
    ),
    "every_block": N_(
        "the mask is on the wrong blocks: the diagonal's mask was applied to the "
        "earlier ranks' blocks too, whose keys all come before this rank's queries (only the own "
        "block is masked)"
    ),
    "reversed": N_(
        "the causal mask is reversed: queries attended to later keys instead of earlier ones"
    ),
    "no_rescale": N_(
        "softmax without rescaling by the running max: when a block raises a row's "
        "maximum from m to m', the sums kept so far must be multiplied by exp(m - m')"
    ),
    "unscaled": N_("the scores were not scaled by 1 / sqrt(d)"),
}


def _close(got: Any, want: np.ndarray, rtol: float = 1e-5) -> bool:
    if not isinstance(got, np.ndarray) or got.shape != want.shape or got.dtype.kind != "f":
        return False
    if not (np.all(np.isfinite(got)) and np.all(np.isfinite(want))):
        return False
    return bool(np.abs(got - want).max(initial=0.0) <= rtol * max(np.abs(want).max(), 1.0))


def _values(case: dict, rank: int, n: int, out: Any, head: str) -> str:
    """Return "" or how rank ``rank``'s output differs from full causal attention."""
    T = case["T"]
    q, k, v = (t.numpy() for t in sequence(case))
    lo, hi = chunk_bounds(T, n)[rank]
    masks = _masks(T, n)
    want = attention(q, k, v, masks["causal"])[:, lo:hi]
    if not isinstance(out, np.ndarray) or out.shape != want.shape:
        shape = getattr(out, "shape", type(out).__name__)
        return _(
            "{head}: rank {rank} returned {shape}, not its queries' output of shape {want}"
        ).format(head=head, rank=rank, shape=shape, want=want.shape)
    if _close(out, want):
        return ""
    variants = {name: attention(q, k, v, mask)[:, lo:hi] for name, mask in masks.items()}
    variants["no_rescale"] = _no_rescale(q, k, v, T, n, rank)
    variants["unscaled"] = attention(q, k, v, masks["causal"], scale=False)[:, lo:hi]
    for name, variant in variants.items():
        if name != "causal" and _close(out, variant):
            return _("{head}: rank {rank}'s output: {mistake}").format(
                head=head, rank=rank, mistake=_(_MISTAKES[name])
            )
    if not np.all(np.isfinite(out)):
        return _("{head}: rank {rank}'s output holds nan or inf").format(head=head, rank=rank)
    return _(
        "{head}: rank {rank}'s output differs from full causal attention over the {T} tokens"
    ).format(head=head, rank=rank, T=T)


def _traffic(case: dict, rank: int, n: int, p2p: dict, head: str) -> str:
    """Return "" or how this rank's traffic differs from the ring's N - 1 key / value blocks."""
    layout = contiguous_layout(case["T"], n)
    width = case["heads"] * case["d"]
    want = ring_traffic(layout, rank, 1, width, 1)["forward"]
    right, left = (rank + 1) % n, (rank - 1) % n
    sent = {q: s for q, s in p2p.items() if s[0]}
    heard = {q for q, s in p2p.items() if s[2]}
    if set(sent) != {right} or heard != {left}:
        talked = ", ".join(
            _("rank {q}: {a} messages / {b} bytes out, {c} / {e} in").format(
                q=q, a=p2p[q][0], b=p2p[q][1], c=p2p[q][2], e=p2p[q][3]
            )
            for q in sorted(p2p)
        )
        return _(
            "{head}: rank {rank} talked to {peers}; the ring sends only to rank "
            "{right} (rank + 1) and hears only from rank {left} (rank - 1)"
        ).format(head=head, rank=rank, peers=talked or _("nobody"), right=right, left=left)
    messages, nbytes = sent[right][:2]
    if nbytes == want and messages in (n - 1, 2 * (n - 1)):
        return ""
    every = ring_traffic(layout, rank, 1, width, 1)["backward"] - want
    why = ""
    if nbytes == every:
        why = _(
            " (all N = {n} blocks: the last hop only brings a block back to its owner, who "
            "has it; pass it on N - 1 times)"
        ).format(n=n)
    elif nbytes == 2 * want:
        why = _(" (twice: float64, or K and V sent twice; send the float32 blocks once)")
    return _(
        "{head}: rank {rank} sent {messages} messages / {nbytes} bytes; the ring sends N - 1 = "
        "{hops} key / value blocks, {want} bytes (the blocks of ranks "
        "{owners} in turn){why}"
    ).format(
        head=head,
        rank=rank,
        messages=messages,
        nbytes=nbytes,
        hops=n - 1,
        want=want,
        owners=", ".join(str((rank - s) % n) for s in range(n - 1)),
        why=why,
    )


def judge_ring(case: dict, rank: int, n: int, data: Any) -> str:
    """Return "" or what is wrong with rank ``rank``'s data for one case of A9.2."""
    if not isinstance(data, (list, tuple)) or len(data) != 3:
        return _("rank {rank} returned no result").format(rank=rank)
    out, used, p2p = data
    T = case["T"]
    sizes = ", ".join(str(b - a) for a, b in chunk_bounds(T, n))
    head = _("T = {T} tokens on {n} ranks ({sizes}), {heads} heads of {d}").format(
        T=T, n=n, sizes=sizes, heads=case["heads"], d=case["d"]
    )
    used = used_of(used)
    if used:
        names = ", ".join(f"comm.{name}" for name in sorted(used))
        return _(
            "{head}: rank {rank} called {names} (a built-in collective): pass the key / value "
            "blocks round the ring with point-to-point messages (comm.sendrecv)"
        ).format(head=head, rank=rank, names=names)
    return _values(case, rank, n, out, head) or _traffic(case, rank, n, p2p_of(p2p), head)
