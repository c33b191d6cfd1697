"""Wire bytes (course_lib.comm.wire): the formulas and the counters' pricing.

Built-ins against from-scratch algorithms on real ranks: tests/lib/comm/test_comm_backends.py
(its ``wire`` suite shares that module's worlds).
"""

from __future__ import annotations

import math

import pytest

from course_lib.comm.stats import CommStats
from course_lib.comm.wire import collective_wire_bytes, collectives_wire_bytes, wire_bytes


@pytest.mark.parametrize("n", [2, 3, 4, 6, 8])
def test_the_formulas(n):
    s = 40_000  # bytes, above every MPICH short-message threshold but the broadcast's at N >= 8
    assert collective_wire_bytes("allreduce", s, n, "gloo") == pytest.approx(2 * (n - 1) / n * s)
    assert collective_wire_bytes("allgather", s, n, "gloo") == (n - 1) * s
    assert collective_wire_bytes("broadcast", s, n, "gloo") == pytest.approx((n - 1) / n * s)
    assert collective_wire_bytes("barrier", 0, n, "gloo") == 0.0
    # Rabenseifner above 2048 bytes: the ring's bytes; recursive doubling at or below it
    assert collective_wire_bytes("allreduce", s, n, "mpi") == pytest.approx(2 * (n - 1) / n * s)
    pof2 = 2 ** int(math.log2(n))
    small = (2 * (n - pof2) + pof2 * math.log2(pof2)) * 2048 / n
    assert collective_wire_bytes("allreduce", 2048, n, "mpi") == pytest.approx(small)
    assert collective_wire_bytes("allgather", s, n, "mpi") == (n - 1) * s
    if n & (n - 1) == 0:
        assert collective_wire_bytes("reduce_scatter", s, n, "mpi") == pytest.approx(
            (n - 1) / n * s
        )
    # the kit's gloo reduce_scatter is an allreduce of a copy
    assert collective_wire_bytes("reduce_scatter", s, n, "gloo") == pytest.approx(
        2 * (n - 1) / n * s
    )


def test_a_single_rank_puts_nothing_on_the_wire():
    assert collective_wire_bytes("allreduce", 4000, 1, "gloo") == 0.0


def test_unknown_backends_and_collectives_are_refused():
    with pytest.raises(ValueError, match="no wire model for backend"):
        collective_wire_bytes("allreduce", 4, 2, "nccl")
    with pytest.raises(ValueError, match="no wire model for collective"):
        collective_wire_bytes("alltoall", 4, 2, "gloo")


def test_counters_are_priced_call_by_call():
    stats = CommStats()
    stats.peer(1).bytes_sent = 1000  # point-to-point: on the wire as counted
    stats.collective("allreduce").add(1024)  # MPICH: recursive doubling (short)
    stats.collective("allreduce").add(40_000)  # MPICH: Rabenseifner
    by_call = collective_wire_bytes("allreduce", 1024, 4, "mpi") + 1.5 * 40_000
    assert wire_bytes(stats, 4, "mpi") == pytest.approx(1000 + by_call)
    # the same bytes as one mean-sized call would be priced wrongly: sizes are kept per call
    assert by_call != pytest.approx(2 * collective_wire_bytes("allreduce", 20_512, 4, "mpi"))
    # a counter updated by hand (no sizes) is priced at its mean size
    stats.collective("allgather").calls, stats.collective("allgather").bytes = 2, 800
    assert collectives_wire_bytes(stats, 4, "gloo") == pytest.approx(1.5 * 41_024 + 3 * 800)


def test_all_to_all_wire_bytes_are_the_blocks_sent_to_other_ranks():
    # the counter records the blocks addressed to other ranks, each sent once and directly
    for backend in ("gloo", "mpi"):
        assert collective_wire_bytes("all_to_all", 3000, 4, backend) == 3000
        assert collective_wire_bytes("all_to_all", 3000, 1, backend) == 0.0
