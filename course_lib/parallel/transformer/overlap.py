"""Lecture 14: ring attention's transfers hidden behind its compute, timed on an emulated link.

Each step of the ring computes one key / value block while the next one travels. Posting the
transfer first (``overlap=True``) makes a step cost about max(compute, transfer); waiting for
it first costs compute + transfer. :func:`time_ring_overlap` times both in interleaved rounds
(:func:`course_lib.timing.interleaved_rounds`) on every rank, through an emulated link so that
the transfer has the length it would have between PCs.
"""

from __future__ import annotations

import torch

from course_lib.comm.communicator import Communicator
from course_lib.comm.emulated_link import EmulatedLink, emulate
from course_lib.parallel.transformer.layouts import zigzag_layout
from course_lib.parallel.transformer.ring import ring_attention
from course_lib.timing import interleaved_rounds

__all__ = ["time_ring_overlap"]


def time_ring_overlap(
    comm: Communicator,
    length: int = 512,
    batch: int = 1,
    n_head: int = 4,
    head_dim: int = 32,
    rounds: int = 5,
    link: EmulatedLink | None = None,
) -> dict[str, list[float]]:
    """Return this rank's seconds per forward of ring attention, overlapped and not (every rank calls it)."""
    slow = emulate(comm, link)
    layout = zigzag_layout(length, comm.world_size)
    gen = torch.Generator().manual_seed(comm.rank)
    q, k, v = (
        torch.randn(batch, n_head, layout.size(comm.rank), head_dim, generator=gen)
        for _ in range(3)
    )

    def run(overlap: bool) -> None:
        with torch.no_grad():
            ring_attention(q, k, v, slow, layout, overlap=overlap)

    spreads = interleaved_rounds(
        {"overlapped": lambda: run(True), "transfer, then compute": lambda: run(False)}, rounds
    )
    return {name: list(spread.samples) for name, spread in spreads.items()}
