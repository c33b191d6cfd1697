"""Lecture 14's schemes on real engines (gloo communicators over 2 and 4 of the session's pooled
engines), each equal to one process on TinyGPT: tensor-parallel attention and vocabulary,
sequence parallelism, ring attention and Ulysses.

For each scheme and world size (``course_lib.parallel.transformer.equality``): the forward
logits and the first gradients (relative 1e-5 per tensor) and every weight after 3 Adam steps
(1e-5 of the largest weight, float32); the bytes of the step counted by the communicator equal
the formulas; the activation memory of the LayerNorm regions and of ring attention equals its
formula. Context parallelism runs T = 11, uneven over the ranks.
"""

from __future__ import annotations

import pytest

from course_lib.parallel.transformer.equality import SCHEMES
from course_lib.parallel.transformer.layouts import (
    causal_pairs,
    contiguous_layout,
    zigzag_layout,
)
from course_lib.parallel.transformer.sequence import sequence_slice

pytestmark = pytest.mark.timeout(300)
SIZES = (2, 4)
RTOL = 1e-5


@pytest.fixture(scope="module")
def cluster(shared_engines):
    """The session's 4 pooled engines, with gloo ``comm2`` and ``comm4`` for this module."""
    from course_lib.comm import setup_communicators

    cluster = shared_engines(4)
    setup_communicators(cluster, backend="gloo", timeout=30)
    cluster.run(_make_subgroups, timeout=60)
    return cluster


def _make_subgroups() -> None:
    from IPython import get_ipython

    ns = get_ipython().user_ns
    for size in SIZES:  # every rank calls subgroup, ranks outside get None
        ns[f"comm{size}"] = ns["comm"].subgroup(list(range(size)))


def _schemes_case(size: int) -> dict | None:
    """Every scheme against one TinyGPT: errors, counted bytes and their formulas, memory."""
    from IPython import get_ipython

    from course_lib.parallel.transformer.equality import SCHEMES, compare_with_one_process

    comm = get_ipython().user_ns[f"comm{size}"]
    if comm is None:
        return None
    # T = 11 for context parallelism: uneven over 2 and 4 ranks (and 4 and 8 zig-zag chunks)
    return {
        s: compare_with_one_process(comm, s, 12 if s in ("tensor", "sequence") else 11)
        for s in SCHEMES
    }


def _ring_case(size: int) -> dict | None:
    """Ring attention against full causal attention, uneven T, both layouts; memory and work."""
    from IPython import get_ipython

    from course_lib.parallel.transformer.equality import ring_against_full

    comm = get_ipython().user_ns[f"comm{size}"]
    if comm is None:
        return None
    return {
        (length, layout): ring_against_full(comm, length, layout)
        for length in (2 * size + 1, 13, 16)
        for layout in ("contiguous", "zig-zag")
    }


@pytest.fixture(scope="module")
def schemes(cluster):
    return {size: [r for r in cluster.run(_schemes_case, size, timeout=240) if r] for size in SIZES}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_equals_one_process(schemes, size, scheme):
    for rank, rows in enumerate(schemes[size]):
        row = rows[scheme]
        where = f"{scheme}, rank {rank} of {size}"
        assert row["forward"] < RTOL, f"{where}: logits differ by {row['forward']:.2g} (relative)"
        assert row["grad"] < RTOL, f"{where}: gradients differ by {row['grad']:.2g}"
        assert row["weights"] < RTOL, (
            f"{where}: weights after 3 Adam steps differ by {row['weights']:.2g}"
        )


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_bytes_per_rank_equal_the_formulas(schemes, size, scheme):
    for rank, rows in enumerate(schemes[size]):
        row = rows[scheme]
        assert row["counted"] == row["formula"], f"{scheme}, rank {rank}: {row['counted']}"
        assert row["sent"] == row["formula_sent"], f"{scheme}, rank {rank}: sent {row['sent']}"


@pytest.mark.parametrize("size", SIZES)
def test_sequence_parallelism_divides_the_layernorm_memory(schemes, size):
    for rows in schemes[size]:
        tensor, sequence = rows["tensor"], rows["sequence"]
        assert tensor["layernorm"] == tensor["layernorm_formula"]
        assert sequence["layernorm"] == sequence["layernorm_formula"]
        assert tensor["layernorm"] == size * sequence["layernorm"]


@pytest.mark.parametrize("size", SIZES)
def test_ring_attention_equals_full_causal_attention_for_uneven_lengths(cluster, size):
    for rank, cases in enumerate(cluster.run(_ring_case, size, timeout=120)[:size]):
        for (length, name), row in cases.items():
            where = f"T={length}, {name}, rank {rank} of {size}"
            assert row["error"] < 1e-5, f"{where}: differs by {row['error']:.2g}"
            for key in ("saved", "scores", "block"):
                assert row[key] == row["formula"][key], f"{where}: {key}"


@pytest.mark.parametrize("size", [2, 3, 4, 8])
def test_zigzag_balances_the_causal_work_and_contiguous_does_not(size):
    length = 16 * size
    zigzag = [causal_pairs(zigzag_layout(length, size), r) for r in range(size)]
    contiguous = [causal_pairs(contiguous_layout(length, size), r) for r in range(size)]
    assert zigzag == [(2 * size + 1) * (length // (2 * size)) ** 2] * size  # equal work
    assert contiguous == [(r + 1) * (length // size) ** 2 for r in range(size)]
    assert max(contiguous) / max(zigzag) > 1.5 if size > 2 else max(contiguous) > max(zigzag)


def test_layouts_cover_every_position_once_and_bad_sizes_name_the_fix():
    for make in (zigzag_layout, contiguous_layout):
        layout = make(13, 3)
        seen = sorted(int(t) for r in range(3) for t in layout.positions(r))
        assert seen == list(range(13))
    with pytest.raises(ValueError, match="use a longer sequence or fewer ranks"):
        zigzag_layout(5, 3)

    class Two:
        world_size, rank = 2, 0

    with pytest.raises(ValueError, match="divides by 2"):
        sequence_slice(7, Two())
