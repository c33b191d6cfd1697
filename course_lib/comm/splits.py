"""Lecture 15: How an all-to-all cuts its buffer: which rows go to each rank, which come from each.

An all-to-all is the transpose of a matrix of blocks: rank ``i`` holds the row of blocks
``(i, 0), ..., (i, N-1)`` and ends with the column ``(0, i), ..., (N-1, i)``. The buffer's first
dimension counts rows (tokens, in a mixture of experts); block ``(i, j)`` is ``send_counts[j]``
consecutive rows of rank ``i``. Equal blocks are MPI's ``Alltoall``, blocks of any size its
``Alltoallv``: then a rank must know how many rows it will receive from each rank, which the
ranks first tell each other with an all-to-all of one count each.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import accumulate

from course_lib.comm.buffers import Buffer

__all__ = ["RowSplit", "row_split"]


@dataclass(frozen=True)
class RowSplit:
    """The rows this rank sends to and receives from every rank, and the shape of one row."""

    row_shape: tuple[int, ...]
    send_counts: tuple[int, ...]
    recv_counts: tuple[int, ...] | None  # None until the ranks have exchanged their counts

    @property
    def width(self) -> int:
        """Elements per row."""
        out = 1
        for d in self.row_shape:
            out *= d
        return out

    def send_bounds(self) -> list[tuple[int, int]]:
        """Return the element range of the flat send buffer that goes to each rank."""
        return _bounds(self.send_counts, self.width)

    def recv_bounds(self) -> list[tuple[int, int]]:
        """Return the element range of the flat result that comes from each rank."""
        if self.recv_counts is None:
            raise ValueError("the receive counts are not known yet: exchange the counts first")
        return _bounds(self.recv_counts, self.width)

    @property
    def out_shape(self) -> tuple[int, ...]:
        """Shape of the result: every received row, rank 0's first."""
        return (sum(self.recv_counts or ()), *self.row_shape)

    def with_recv(self, recv_counts: list[int]) -> RowSplit:
        """Return this split with the receive counts the other ranks announced."""
        return replace(self, recv_counts=tuple(int(c) for c in recv_counts))


def _bounds(counts: tuple[int, ...], width: int) -> list[tuple[int, int]]:
    ends = list(accumulate(c * width for c in counts))
    return [(e - c * width, e) for c, e in zip(counts, ends, strict=True)]


def row_split(
    tensor: Buffer,
    world_size: int,
    send_counts: list[int] | None = None,
    recv_counts: list[int] | None = None,
) -> RowSplit:
    """Validate an all-to-all's arguments; return how its rows are cut.

    Without ``send_counts`` the rows are cut into ``world_size`` equal blocks (and the same
    number come back from every rank); with them, ``recv_counts`` may be given or left to an
    exchange of counts.
    """
    shape = tuple(int(d) for d in tensor.shape)
    if not shape:
        raise ValueError("all_to_all needs a buffer with at least one dimension (rows first)")
    rows, row_shape = shape[0], shape[1:]
    if send_counts is None:
        if recv_counts is not None:
            raise ValueError(
                "recv_counts needs send_counts: pass both, or neither for equal blocks"
            )
        if rows % world_size:
            raise ValueError(
                f"{rows} rows do not split into {world_size} equal blocks: pass send_counts "
                "(rows for each rank) for blocks of different sizes"
            )
        even = (rows // world_size,) * world_size
        return RowSplit(row_shape, even, even)
    counts = _counts(send_counts, world_size, "send_counts")
    if sum(counts) != rows:
        raise ValueError(f"send_counts {list(counts)} add up to {sum(counts)}, not the {rows} rows")
    got = None if recv_counts is None else _counts(recv_counts, world_size, "recv_counts")
    return RowSplit(row_shape, counts, got)


def _counts(values: list[int], world_size: int, name: str) -> tuple[int, ...]:
    counts = tuple(int(c) for c in values)
    if len(counts) != world_size or min(counts, default=0) < 0:
        raise ValueError(
            f"{name} needs {world_size} counts >= 0 (one per rank), got {list(values)}"
        )
    return counts
