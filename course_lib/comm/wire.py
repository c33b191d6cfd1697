"""Lecture 3: Wire bytes: what a rank puts on the link, from its counters and each backend's algorithms.

A communicator counts two different things (:mod:`course_lib.comm.stats`): the payload bytes it
*sent* point-to-point, which are on the wire as counted, and the *buffer* bytes it handed to a
built-in collective, which are not: a ring allreduce of an ``S``-byte buffer puts
$2\\frac{N-1}{N}S$ on each rank's link, an allgather of ``s`` bytes per rank $(N-1)s$. Adding
buffer bytes to sent bytes mixes two quantities (lecture 6 did, until this module). Here every
built-in collective's wire bytes follow from the algorithm its backend runs and the buffer size
handed to it, so a scheme written from point-to-point and one that calls the backend are
counted alike.

A collective's wire bytes are the bytes its algorithm sends **on average over the ranks** (its
total over all ranks, divided by ``N``). For rank-symmetric algorithms (a ring on a buffer of
a multiple of ``N`` elements, recursive doubling on a power of two) that is every rank's figure;
otherwise ranks differ by a chunk or, for a tree's root and leaves, by more. The header of each
message and a barrier's empty payload are not counted (nor are they by the point-to-point
counters).

The algorithms assumed (each with where it is chosen):

- **gloo** (``torch.distributed``'s ``ProcessGroupGloo``): ``allreduce`` is gloo's ring
  (``gloo/allreduce.cc``: ``ring()`` for ``Algorithm::UNSPECIFIED``, reduce-scatter then
  allgather over ``N`` chunks), $2\\frac{N-1}{N}S$; ``allgather`` a ring, $(N-1)s$;
  ``broadcast`` a tree, every rank but the root receives ``S`` once: $\\frac{N-1}{N}S$ on
  average; ``reduce_scatter`` is, in this kit, an allreduce of a copy
  (:mod:`course_lib.comm.gloo_backend`), so it costs an allreduce.
- **mpi** (MPICH, whose non-blocking collectives the kit calls; the size rules of
  ``src/mpi/coll/mpir_coll_sched_auto.c``, Thakur, Rabenseifner & Gropp 2005):
  ``allreduce`` of at most ``MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE`` = 2048 bytes by recursive
  doubling (``log2 p`` exchanges of the whole buffer among ``p``, the largest power of two
  <= ``N``, plus a fold of the ``N - p`` extra ranks in and out), larger ones by Rabenseifner's
  reduce-scatter + allgather, $2\\frac{N-1}{N}S$ like a ring; ``allgather``: recursive
  doubling, Bruck or ring, $(N-1)s$ each; ``broadcast``: a binomial tree below 12 288 bytes or
  8 ranks, else a binomial scatter then an allgather (van de Geijn);
  ``reduce_scatter``: recursive halving below 512 KiB, pairwise exchange above,
  $\\frac{N-1}{N}S$ on a power of two (recursive halving folds the extra ranks in first).

- **all_to_all** (both backends; gloo's ``all_to_all_single``, MPI's ``Alltoallv``): each block
  goes straight to its rank, so the counter records the bytes addressed to the other ranks,
  and those are the wire bytes: $\frac{N-1}{N}S$ for equal blocks of an ``S``-byte buffer.
  (MPICH's ``Alltoall`` of short blocks may take Bruck's algorithm, which forwards blocks
  through other ranks; the kit calls ``Alltoallv``, which does not.)

MPICH may pick other algorithms where its tuning file or an SMP-aware path applies (ranks
sharing a node exchange through shared memory, not a link); the rules above are what it runs
between PCs with the default settings.
"""

from __future__ import annotations

import math

from course_lib.comm.stats import CommStats

__all__ = [
    "MPICH_ALLREDUCE_SHORT",
    "collective_wire_bytes",
    "collectives_wire_bytes",
    "wire_bytes",
]

#: MPICH's ``MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE``: up to this many bytes, recursive doubling.
MPICH_ALLREDUCE_SHORT = 2048
_MPICH_BCAST_SHORT = 12288  # MPIR_CVAR_BCAST_SHORT_MSG_SIZE
_MPICH_BCAST_MIN_PROCS = 8  # MPIR_CVAR_BCAST_MIN_PROCS


def _ring_allreduce(nbytes: float, n: int) -> float:
    return 2 * (n - 1) / n * nbytes


def _tree_broadcast(nbytes: float, n: int) -> float:
    return (n - 1) / n * nbytes  # every rank but the root receives the buffer once


def _mpich_allreduce(nbytes: float, n: int) -> float:
    if nbytes > MPICH_ALLREDUCE_SHORT:  # Rabenseifner: the ring's bytes, fewer messages
        return _ring_allreduce(nbytes, n)
    pof2 = 1 << (n.bit_length() - 1)
    rem = n - pof2  # folded in (rem messages of S) before, and out (rem more) after
    return (2 * rem + pof2 * int(math.log2(pof2))) * nbytes / n


def _mpich_broadcast(nbytes: float, n: int) -> float:
    if nbytes < _MPICH_BCAST_SHORT or n < _MPICH_BCAST_MIN_PROCS:
        return _tree_broadcast(nbytes, n)
    chunk = math.ceil(nbytes / n)  # binomial scatter: relative rank r gets its subtree's chunks
    scatter = sum(max(0.0, min((r & -r) * chunk, nbytes - r * chunk)) for r in range(1, n))
    return (scatter + (n - 1) * nbytes) / n  # then an allgather of the chunks: (N-1) S in all


def _mpich_reduce_scatter(nbytes: float, n: int) -> float:
    pof2 = 1 << (n.bit_length() - 1)
    if pof2 == n or nbytes >= 524288:  # recursive halving on 2^k, or pairwise: N-1 chunks each
        return (n - 1) / n * nbytes
    rem = n - pof2  # halving folds the extra ranks in (whole buffers) and hands back their chunk
    return (rem * nbytes + (pof2 - 1) * nbytes + rem * nbytes / n) / n


def _all_to_all(nbytes: float, n: int) -> float:
    return nbytes  # counted as the bytes addressed to other ranks, each sent once, directly


_WIRE = {
    "gloo": {
        "allreduce": _ring_allreduce,
        "reduce_scatter": _ring_allreduce,  # the kit's gloo reduce_scatter is one allreduce
        "allgather": lambda s, n: (n - 1) * s,
        "broadcast": _tree_broadcast,
        "barrier": lambda s, n: 0.0,
        "all_to_all": _all_to_all,
    },
    "mpi": {
        "allreduce": _mpich_allreduce,
        "reduce_scatter": _mpich_reduce_scatter,
        "allgather": lambda s, n: (n - 1) * s,
        "broadcast": _mpich_broadcast,
        "barrier": lambda s, n: 0.0,
        "all_to_all": _all_to_all,
    },
}


def collective_wire_bytes(name: str, nbytes: float, world_size: int, backend: str) -> float:
    """Return the bytes one call of built-in ``name`` puts on a rank's link (mean over ranks).

    ``nbytes`` is the buffer handed to the call, as the counters record it: the whole buffer
    for ``allreduce``, ``broadcast`` and ``reduce_scatter``, this rank's part for ``allgather``,
    the blocks addressed to other ranks for ``all_to_all``.
    """
    if backend not in _WIRE:
        raise ValueError(f"no wire model for backend {backend!r}; known: {sorted(_WIRE)}")
    if name not in _WIRE[backend]:
        raise ValueError(f"no wire model for collective {name!r}; known: {sorted(_WIRE[backend])}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return 0.0 if world_size == 1 else float(_WIRE[backend][name](nbytes, world_size))


def collectives_wire_bytes(stats: CommStats, world_size: int, backend: str) -> float:
    """Return the wire bytes of every built-in collective in ``stats``, call by call.

    Each call is priced at its own buffer size (MPICH picks its algorithm by size); calls
    counted without a size (a counter updated by hand) are priced at their mean size.
    """
    total = 0.0
    for name, stat in stats.collectives.items():
        for nbytes, calls in stat.sizes.items():
            total += calls * collective_wire_bytes(name, nbytes, world_size, backend)
        unsized = stat.calls - sum(stat.sizes.values())
        if unsized > 0:
            mean = (stat.bytes - sum(b * c for b, c in stat.sizes.items())) / unsized
            total += unsized * collective_wire_bytes(name, mean, world_size, backend)
    return total


def wire_bytes(stats: CommStats, world_size: int, backend: str) -> float:
    """Return the bytes this rank put on the link: point-to-point payload sent + collectives' wire bytes."""
    return stats.bytes_sent + collectives_wire_bytes(stats, world_size, backend)
