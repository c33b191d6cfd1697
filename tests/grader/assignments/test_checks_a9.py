"""A9's checks: the instructor's answers pass; stubs and the tempting wrong answers (softmax
without rescaling by the running max, the rescale inverted or on one sum only, a normalised
output kept, the block's own maximum; the causal mask missing, on the wrong blocks or reversed,
the scores unscaled, a hop too many, a non-ring exchange, the kit's own ring attention) fail
with the verdict that names the mistake. A9.1 runs without engines; A9.2 on 3 real engines."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
import torch

from course_grader.assignments.a9.checks import (
    A9_POINTS,
    check_online_softmax_update,
    check_ring_attention_forward,
)
from course_grader.cells import answer_id
from course_grader.selftest.attacks.counters import FORGED_COUNTERS
from course_lib.comm import chunk_bounds

SOURCE = Path(__file__).resolve().parents[3] / "assignments" / "source" / "A9_ring_attention.ipynb"
ANSWERS = {
    answer_id(c): c.source for c in nbformat.read(SOURCE, as_version=4).cells if answer_id(c)
}


def _define(code: str, name: str):
    """Run answer code as a notebook would: in ``__main__``, with the set-up cell's names."""
    namespace = {"__name__": "__main__", "torch": torch, "chunk_bounds": chunk_bounds}
    exec(code, namespace)
    return namespace[name]


def _mutant(exercise: str, *edits: tuple[str, str]) -> str:
    code = ANSWERS[exercise]
    for old, new in edits:
        assert old in code, f"the solution of {exercise} no longer holds {old!r}"
        code = code.replace(old, new)
    return code


def stub(*args):
    raise NotImplementedError("Exercise A9.x: write your answer here")


def _verdict(verdict, exercise: str) -> str:
    full = A9_POINTS[exercise]
    assert (verdict.points, verdict.max_points) == ((full if verdict.passed else 0.0), full)
    return f"{'PASS' if verdict.passed else 'FAIL'} {verdict.detail}"


def _update(code: str) -> str:
    fn = _define(code, "online_softmax_update")
    return _verdict(check_online_softmax_update(fn, verbose=False), "A9.1")


SUMS = "ell * rescale + e.sum(-1), acc * rescale[..., None] + e @ v"
UPDATE_MISTAKES = [
    (
        (SUMS, "ell + e.sum(-1), acc + e @ v"),
        r"case 2 \(a block that raises the running maximum, .*\): softmax without rescaling by "
        r"the running max: .*",
    ),
    (
        ("torch.exp(m - m_new)", "torch.exp(m_new - m)"),
        r"case 1 \(the first block \(m = -inf\), .*\): the new state holds nan or inf; .*",
    ),
    (
        ("acc * rescale[..., None] + e @ v", "acc + e @ v"),
        r"case 2 .*: ell was rescaled by exp\(m - m'\) but acc was not: .*",
    ),
    (
        ("ell * rescale + e.sum(-1)", "ell + e.sum(-1)"),
        r"case 2 .*: acc was rescaled by exp\(m - m'\) but ell was not: .*",
    ),
    (
        ("torch.maximum(m, s.amax(-1))", "s.amax(-1)"),
        r"case 3 \(a block below the running maximum, .*\): m' is the block's own maximum, not "
        r"the running one.*",
    ),
    (
        (
            f"return m_new, {SUMS}",
            "ell2 = ell * rescale + e.sum(-1)\n    acc2 = acc * ell[..., None] * rescale[..., "
            "None] + e @ v\n    return m_new, ell2, acc2 / ell2[..., None]",
        ),
        r"case 1 .*: acc is normalised \(acc / ell\): keep the unnormalised sum .*",
    ),
]


def test_a9_1_passes_the_source_and_fails_the_stub_and_each_usual_mistake():
    assert re.match(r"PASS 4 blocks", _update(ANSWERS["A9.1"]))
    verdict = check_online_softmax_update(stub, verbose=False)
    assert _verdict(verdict, "A9.1").startswith("FAIL not implemented yet: Exercise A9.x")
    for edit, pattern in UPDATE_MISTAKES:
        got = _update(_mutant("A9.1", edit))
        assert re.fullmatch(f"FAIL {pattern}", got), (edit, got)
    assert re.match(r"PASS", _update(ANSWERS["A9.1"].replace("[..., None]", ".unsqueeze(-1)")))


@pytest.fixture(scope="module")
def cluster(shared_engines):
    from course_lib.comm import setup_communicators

    cl = shared_engines(3)  # from the session's pool (tests/conftest.py)
    setup_communicators(cl, backend="gloo", timeout=20)
    cl.view.execute("import torch", block=True)
    return cl


def _ring(code: str, cluster) -> str:
    fn = _define(code, "ring_attention_forward")
    return _verdict(check_ring_attention_forward(fn, cluster, verbose=False), "A9.2")


OWN_MASK = "if src == r:"
COMPUTED = "if src <= r:"
TRIU = "torch.ones(size, size, dtype=torch.bool).triu(1)"
EVERY_TRIU = "torch.ones(s.shape[-2], size, dtype=torch.bool).triu(1)"
RING_MISTAKES = [
    (
        [(OWN_MASK, "if False:"), (COMPUTED, "if True:")],
        r"\d",
        "the causal mask is missing: .*",
    ),
    ([(OWN_MASK, "if False:")], r"\d", "this rank's own block was attended whole: .*"),
    (
        [(COMPUTED, "if True:")],
        r"\d",
        "the mask is on the wrong blocks: the blocks of later ranks .*",
    ),
    (
        [(OWN_MASK, "if True:"), (TRIU, EVERY_TRIU)],
        r"\d",
        "the mask is on the wrong blocks: the diagonal's mask was applied to the earlier ranks' .*",
    ),
    (
        [(COMPUTED, "if src >= r:"), (TRIU, TRIU.replace("triu(1)", "tril(-1)"))],
        r"\d",
        "the causal mask is reversed: .*",
    ),
    (
        [("ell = ell * rescale", "ell = ell"), ("acc = acc * rescale[..., None]", "acc = acc")],
        r"\d",
        "softmax without rescaling by the running max: .*",
    ),
    ([(") * scale", ") * 1.0")], r"\d", r"the scores were not scaled by 1 / sqrt\(d\)"),
]
DIRECT = '''
def ring_attention_forward(comm, q, k, v, T):
    """Every rank sends its block straight to every other: the right output, not a ring."""
    r, n = comm.rank, comm.world_size
    bounds = chunk_bounds(T, n)
    lo, hi = bounds[r]
    keys, values = [None] * n, [None] * n
    keys[r], values[r] = k, v
    for j in range(1, n):
        dst, src = (r + j) % n, (r - j) % n
        a, b = bounds[src]
        got = torch.empty(2, q.shape[0], b - a, q.shape[-1])
        comm.sendrecv(torch.stack([k, v]), dst, got, src)
        keys[src], values[src] = got[0], got[1]
    s = q @ torch.cat(keys, -2).transpose(-1, -2) * q.shape[-1] ** -0.5
    i, j = torch.arange(lo, hi)[:, None], torch.arange(T)[None, :]
    return torch.softmax(s.masked_fill(j > i, float("-inf")), -1) @ torch.cat(values, -2)
'''
KITS_RING = """
from course_lib.parallel.transformer.layouts import contiguous_layout
from course_lib.parallel.transformer.ring import ring_attention


def ring_attention_forward(comm, q, k, v, T):
    layout = contiguous_layout(T, comm.world_size)
    return ring_attention(q[None], k[None], v[None], comm, layout)[0].detach()
"""


@pytest.mark.slow
def test_a9_2_passes_the_source_and_fails_the_stub_and_each_usual_mistake(cluster):
    head = r"T = 11 tokens on 3 ranks \(4, 4, 3\), 2 heads of 4: "
    assert re.match(r"PASS 3 ranks, T = 11 and 16", _ring(ANSWERS["A9.2"], cluster))
    verdict = check_ring_attention_forward(stub, cluster, verbose=False)
    assert _verdict(verdict, "A9.2").startswith("FAIL not implemented yet: Exercise A9.x")
    for edits, rank, pattern in RING_MISTAKES:
        got = _ring(_mutant("A9.2", *edits), cluster)
        assert re.fullmatch(f"FAIL {head}rank {rank}'s output: {pattern}", got), (edits, got)
    got = _ring(_mutant("A9.2", ("if step < n - 1:", "if True:")), cluster)
    assert re.fullmatch(
        rf"FAIL {head}rank 0 sent 3 messages / 704 bytes; the ring sends N - 1 = 2 key / value "
        r"blocks, 448 bytes \(the blocks of ranks 0, 2 in turn\) \(all N = 3 blocks: .*\)",
        got,
    ), got
    got = _ring(DIRECT, cluster)
    assert re.fullmatch(rf"FAIL {head}rank 0 talked to rank 1: .*, rank 2: .*; the ring .*", got)
    # Counters rewritten after a built-in: the counters alone are fooled (the wire is not:
    # tests/grader/sandbox/test_grading_wire.py).
    assert _ring(FORGED_COUNTERS[("A9", "A9.2")], cluster).startswith("PASS")
    assert _ring(KITS_RING, cluster) == (
        "FAIL your answer calls course_lib.parallel.transformer.ring.ring_attention, which "
        "answers the exercise: write the ring yourself from comm.sendrecv"
    )


def test_the_judges_reference_is_torchs_causal_attention_and_the_mistakes_differ_from_it():
    # No engines: the float64 reference equals torch's own causal attention, and every mistake
    # the verdict names gives a different output on the check's cases (so it can be told apart).
    import numpy as np
    import torch.nn.functional as F

    from course_grader.assignments.a9.collect import sequence
    from course_grader.assignments.a9.judge import _masks, _no_rescale, a9_ring_cases, attention

    for case in a9_ring_cases():
        q, k, v = sequence(case)
        masks = _masks(case["T"], 3)
        want = attention(q, k, v, masks["causal"])
        torch_causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert np.allclose(want, torch_causal.numpy(), rtol=1e-5, atol=1e-5)
        for name, mask in masks.items():
            if name not in ("causal", "reversed"):
                assert not np.allclose(attention(q, k, v, mask), want, atol=1e-3), name
        lo, hi = chunk_bounds(case["T"], 3)[2]
        assert not np.allclose(_no_rescale(q, k, v, case["T"], 3, 2), want[:, lo:hi], atol=1e-3)
