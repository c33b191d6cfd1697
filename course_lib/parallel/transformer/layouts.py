"""Lecture 14: which tokens of a sequence each rank holds under context parallelism.

A layout cuts $T$ tokens into chunks (``chunk_bounds``: uneven $T$ works, the first chunks one
token longer) and gives each rank some chunks. With causal attention a query sees only earlier
keys, so the work of a rank depends on *where* its tokens are:

- **contiguous**: rank r holds chunk r of P; the last rank's queries see every key, the first
  rank's only its own: rank r computes $r + 1$ of the $P$ blocks, the busiest about twice the
  average (Liu et al. 2023 leave this imbalance; later work fixes it);
- **zig-zag**: $2P$ chunks, rank r holds chunks r and $2P-1-r$ (one early, one late), so every
  rank computes $2P + 1$ of the $(2P)^2$ chunk pairs' causal half: equal work (Brandon et al.
  2023, "Striped attention", and the zig-zag of ring-flash-attention / Llama 3's context
  parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib.comm.buffers import chunk_bounds

__all__ = ["Layout", "causal_pairs", "contiguous_layout", "zigzag_layout"]


@dataclass(frozen=True)
class Layout:
    """Per rank, its chunks as ``(chunk id, start, stop)`` in global positions, in local order."""

    length: int
    chunks: tuple[tuple[tuple[int, int, int], ...], ...]
    name: str = "layout"

    @property
    def world_size(self) -> int:
        """The number of ranks the layout is for."""
        return len(self.chunks)

    def size(self, rank: int) -> int:
        """Return the number of tokens ``rank`` holds."""
        return sum(stop - start for _, start, stop in self.chunks[rank])

    def positions(self, rank: int) -> torch.Tensor:
        """Return the global positions of ``rank``'s tokens, in its local order."""
        return torch.cat([torch.arange(a, b) for _, a, b in self.chunks[rank]])

    def local_chunks(self, rank: int) -> list[tuple[int, int, int]]:
        """Return ``rank``'s chunks as ``(chunk id, local start, local stop)``."""
        out, at = [], 0
        for cid, a, b in self.chunks[rank]:
            out.append((cid, at, at + b - a))
            at += b - a
        return out


def _check(length: int, world_size: int, parts: int) -> None:
    if world_size < 1 or length < parts:
        raise ValueError(
            f"cannot cut T={length} tokens into {parts} chunks for {world_size} ranks: every "
            f"chunk needs a token; use a longer sequence or fewer ranks"
        )


def contiguous_layout(length: int, world_size: int) -> Layout:
    """Return the layout in which rank r holds the r-th of ``world_size`` consecutive chunks."""
    _check(length, world_size, world_size)
    bounds = chunk_bounds(length, world_size)
    return Layout(length, tuple(((r, *bounds[r]),) for r in range(world_size)), "contiguous")


def zigzag_layout(length: int, world_size: int) -> Layout:
    """Return the layout in which rank r holds chunks r and 2P-1-r of 2P (balanced causal work)."""
    _check(length, world_size, 2 * world_size)
    bounds = chunk_bounds(length, 2 * world_size)
    last = 2 * world_size - 1
    chunks = tuple(((r, *bounds[r]), (last - r, *bounds[last - r])) for r in range(world_size))
    return Layout(length, chunks, "zig-zag")


def causal_pairs(layout: Layout, rank: int) -> int:
    """Return the scores (query, key pairs) per head that ``rank`` computes: its work.

    A pair of chunks is computed when the key chunk is not later than the query chunk; a chunk
    with itself is computed whole and its upper triangle masked, as a kernel does.
    """
    sizes = {cid: b - a for chunks in layout.chunks for cid, a, b in chunks}
    total = 0
    for qid, a, b in layout.chunks[rank]:
        total += sum(n for kid, n in sizes.items() if kid < qid) * (b - a)
        total += (b - a) * (b - a)
    return total
