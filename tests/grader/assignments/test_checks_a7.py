"""A7's checks on real engines: the instructor's answers pass; stubs and the tempting wrong answers
(a sum for a mean, a built-in or a point-to-point allreduce, shards of the wrong size, the whole
bucket returned, a mean that is not the ring's bits, a non-ring exchange, the whole optimiser
state, a new optimiser each step, a copy of the shard, a gather out of place or of whole
buckets) fail with the verdict that names the mistake; every check is seen failing."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
import torch

from course_grader.assignments.a7.checks import (
    A7_POINTS,
    check_allgather_shards,
    check_reduce_scatter_mean,
    check_shard_adam,
    check_stage2_step,
)
from course_grader.cells import answer_id
from course_grader.verdict.guard import rejected_answers
from course_lib.comm import chunk_bounds

SOURCE = Path(__file__).resolve().parents[3] / "assignments" / "source" / "A7_zero_stage2.ipynb"
ANSWERS = {
    answer_id(c): c.source for c in nbformat.read(SOURCE, as_version=4).cells if answer_id(c)
}
NAMES = {
    "A7.1": "reduce_scatter_mean",
    "A7.2": "adam_on_shard",
    "A7.3": "allgather_shards",
    "A7.4": "stage2_step",
}
CHECKS = {
    "A7.1": check_reduce_scatter_mean,
    "A7.2": check_shard_adam,
    "A7.3": check_allgather_shards,
    "A7.4": check_stage2_step,
}


def _define(answers: dict[str, str]) -> dict:
    """Run answer code as a notebook would: in ``__main__``, with the set-up cell's names."""
    namespace = {"__name__": "__main__", "torch": torch, "chunk_bounds": chunk_bounds}
    for exercise in sorted(answers):
        exec(answers[exercise], namespace)
    return namespace


def _mutant(*edits: tuple[str, str, str]) -> dict:
    """Return the namespace of every answer, with ``(exercise, old, new)`` edits applied."""
    codes = dict(ANSWERS)
    for exercise, old, new in edits:
        assert old in codes[exercise], f"the solution of {exercise} no longer holds {old!r}"
        codes[exercise] = codes[exercise].replace(old, new)
    return _define(codes)


def _replaced(exercise: str, code: str) -> dict:
    return _define(dict(ANSWERS, **{exercise: code}))


def stub(*args):
    raise NotImplementedError("Exercise A7.x: write your answer here")


def _run(exercise: str, fn, cluster) -> str:
    verdict = CHECKS[exercise](fn, cluster, verbose=False)
    full = A7_POINTS[exercise]
    assert (verdict.points, verdict.max_points) == ((full if verdict.passed else 0.0), full)
    return f"{'PASS' if verdict.passed else 'FAIL'} {verdict.detail}"


@pytest.fixture(scope="module")
def cluster(shared_engines):
    from course_lib.comm import setup_communicators

    cl = shared_engines(3)  # from the session's pool (tests/conftest.py)
    setup_communicators(cl, backend="gloo", timeout=20)
    cl.view.execute("import torch", block=True)
    return cl


SUM = ("A7.1", "return flat[lo:hi] / n", "return flat[lo:hi]")
TIMES = ("A7.1", "return flat[lo:hi] / n", "return flat[lo:hi] * (1 / n)")
WHOLE_BUCKET = ("A7.1", "return flat[lo:hi] / n", "return flat / n")
BUILTIN = (
    "A7.1",
    "    for k in range(n - 1):  # pass chunk",
    "    comm.allreduce(flat)\n    for k in range(0):  # pass chunk",
)
RING_ALLREDUCE = (  # the ring's allgather after its reduce-scatter: every rank the whole sum
    "A7.1",
    "    lo, hi = bounds[r]\n",
    "    for k in range(n - 1):\n"
    "        a, b = bounds[(r - k) % n]\n"
    "        c, d = bounds[(r - k - 1) % n]\n"
    "        comm.sendrecv(flat[a:b], right, flat[c:d], left)\n"
    "    lo, hi = bounds[r]\n",
)
FLOOR = "    bounds = [(i * (m // n), m if i == n - 1 else (i + 1) * (m // n)) for i in range(n)]\n"
FLOOR_SHARDS = [  # every shard m // N long, the last one the rest: consistent, but not the layout
    ("A7.1", "    bounds = chunk_bounds(flat.numel(), n)\n", "    m = flat.numel()\n" + FLOOR),
    ("A7.1", "scratch = torch.empty(bounds[0][1] - bounds[0][0])", "scratch = torch.empty(m)"),
    (
        "A7.2",
        "        lo, hi = chunk_bounds(flat_params.numel(), comm.world_size)[comm.rank]\n",
        "        m, n = flat_params.numel(), comm.world_size\n"
        + FLOOR.replace("    ", "        ", 1)
        + "        lo, hi = bounds[comm.rank]\n",
    ),
    ("A7.3", "    bounds = chunk_bounds(flat.numel(), n)\n", "    m = flat.numel()\n" + FLOOR),
]
KITS_RING = """
from course_lib.collectives.ring import ring_reduce_scatter


def reduce_scatter_mean(comm, flat):
    ring_reduce_scatter(comm, flat)
    lo, hi = chunk_bounds(flat.numel(), comm.world_size)[comm.rank]
    return flat[lo:hi] / comm.world_size
"""
DIRECT = '''
def reduce_scatter_mean(comm, flat):
    """Each rank sends chunk c straight to its owner: the right bytes, but not a ring."""
    r, n = comm.rank, comm.world_size
    bounds = chunk_bounds(flat.numel(), n)
    lo, hi = bounds[r]
    total = flat[lo:hi].clone()
    for k in range(1, n):
        dst, src = (r + k) % n, (r - k) % n
        a, b = bounds[dst]
        got = torch.empty(hi - lo)
        comm.sendrecv(flat[a:b], dst, got, src)
        total += got
    return total / n
'''
WHOLE_STATE = (
    "A7.2",
    """    if "optimizer" not in state:  # the first call: Adam over a view of this rank's slice
        lo, hi = chunk_bounds(flat_params.numel(), comm.world_size)[comm.rank]
        state["shard"] = torch.nn.Parameter(flat_params[lo:hi])  # a view: updates land in flat_params
        state["optimizer"] = torch.optim.Adam([state["shard"]], lr=lr)  # m, v: shard-sized
    state["shard"].grad = grad_shard
""",
    """    lo, hi = chunk_bounds(flat_params.numel(), comm.world_size)[comm.rank]
    if "optimizer" not in state:  # Adam over the whole bucket: m and v of every value
        state["shard"] = torch.nn.Parameter(flat_params)
        state["optimizer"] = torch.optim.Adam([state["shard"]], lr=lr)
    state["shard"].grad = torch.zeros_like(flat_params)
    state["shard"].grad[lo:hi] = grad_shard
""",
)
NO_GATHER = ("A7.4", "    allgather_shards(comm, flat_params)", "    pass")
FRESH = ("A7.2", 'if "optimizer" not in state:', "if True:")
COPY = (
    "A7.2",
    "torch.nn.Parameter(flat_params[lo:hi])",
    "torch.nn.Parameter(flat_params[lo:hi].clone())",
)
BUILTIN_GATHER = """
def allgather_shards(comm, flat):
    r, n = comm.rank, comm.world_size
    bounds = chunk_bounds(flat.numel(), n)
    widest = bounds[0][1] - bounds[0][0]
    mine = torch.zeros(widest)
    lo, hi = bounds[r]
    mine[: hi - lo] = flat[lo:hi]
    every = comm.allgather(mine)
    for q, (a, b) in enumerate(bounds):
        flat[a:b] = every[q, : b - a]
    return flat
"""
OUT_OF_PLACE = (
    "A7.3",
    "    r, n = comm.rank, comm.world_size\n",
    "    flat = flat.clone()\n    r, n = comm.rank, comm.world_size\n",
)
WHOLE_MESSAGES = (  # every message the whole bucket: right values, (N - 1) times the bytes of a pass
    "A7.3",
    "        comm.sendrecv(flat[a:b], right, flat[c:d], left)\n",
    "        got = torch.empty(flat.numel())\n"
    "        comm.sendrecv(flat, right, got, left)\n"
    "        flat[c:d] = got[c:d]\n",
)


@pytest.mark.slow
def test_a7_checks_pass_the_source_and_fail_stubs_and_the_usual_mistakes(cluster):
    sol = _define(ANSWERS)
    for exercise, name in NAMES.items():
        assert re.match(r"PASS 3 ranks", _run(exercise, sol[name], cluster)), exercise
        assert _run(exercise, stub, cluster).startswith("FAIL not implemented yet: Exercise A7.x")

    kits_ring = _replaced("A7.1", KITS_RING)
    assert _run("A7.1", kits_ring["reduce_scatter_mean"], cluster) == (
        "FAIL your answer calls course_lib.collectives.ring.ring_reduce_scatter, which answers "
        "the exercise: write the ring yourself from comm.sendrecv"
    )
    source = nbformat.read(SOURCE, as_version=4)  # graded, the guard refuses the import itself
    assert (
        "the kit's library holds the reference answers"
        in rejected_answers(source, {"A7.1": KITS_RING})["A7.1"]
    )

    rs = r"bucket of 35 values on 3 ranks \(12, 12, 11\): "
    step = r"3 steps, buckets of 16 and 35 values on 3 ranks: "
    floor = _mutant(*FLOOR_SHARDS)
    expected = [
        (
            "A7.1",
            _mutant(SUM),
            rf"FAIL {rs}rank 0's shard is the sum over the 3 ranks, not their "
            r"mean: divide it by N = 3 .*",
        ),
        (
            "A7.1",
            _mutant(TIMES),
            rf"FAIL {rs}rank \d's shard is the mean to about 1e-7 but not "
            r"bit for bit: .*divide the sum by N once.*",
        ),
        (
            "A7.1",
            _mutant(WHOLE_BUCKET),
            rf"FAIL {rs}rank 0 returned the whole bucket \(35 values\)"
            r"; return only its shard, flat\[0:12\] .*",
        ),
        (
            "A7.1",
            _mutant(BUILTIN),
            rf"FAIL {rs}rank 0 called comm.allreduce: an allreduce leaves "
            r"every rank the whole sum, twice a reduce-scatter's bytes; .*",
        ),
        (
            "A7.1",
            _mutant(RING_ALLREDUCE),
            rf"FAIL {rs}rank 0 sent 4 messages / 184 bytes; the "
            r"reduce-scatter sends 2 messages of one chunk each, 92 bytes \(about twice: that is an "
            r"allreduce's traffic; .*\)",
        ),
        (
            "A7.1",
            floor,
            rf"FAIL {rs}rank 0's shard has shape \(11,\), not \(12,\): 35 values do "
            r"not divide by 3, so chunk_bounds\(35, 3\) gives shards of 12, 12, 11 \(the first 2 one "
            r"longer\); .*",
        ),
        (
            "A7.1",
            _replaced("A7.1", DIRECT),
            rf"FAIL {rs}rank 0 talked to rank 1: .*, rank 2: .*; a "
            r"ring sends only to rank 1 \(rank \+ 1\) and hears only from rank 2 \(rank - 1\)",
        ),
        (
            "A7.2",
            _mutant(WHOLE_STATE),
            r"FAIL 35 weights on 3 ranks, 3 steps: the ledger counts "
            r"28\d bytes of optimiser state on rank 0 \(the whole bucket's\); a rank that keeps the "
            r"whole optimiser state is stage 0: keep Adam's m and v for this rank's shard only, "
            r"8 x 12 = 96 bytes .*",
        ),
        (
            "A7.2",
            _mutant(FRESH),
            r"FAIL 35 weights on 3 ranks, 3 steps: rank 0's updates are "
            r"each a first Adam step: keep the optimiser .* in `state` between calls .*",
        ),
        (
            "A7.2",
            _mutant(COPY),
            r"FAIL 35 weights on 3 ranks, 3 steps: rank 0's shard was not "
            r"updated in flat_params: .*a view of flat_params\[0:12\] \(not a copy\)",
        ),
        (
            "A7.3",
            _replaced("A7.3", BUILTIN_GATHER),
            rf"FAIL {rs}rank 0 called comm.allgather \(a "
            r"built-in collective\): write the allgather from point-to-point messages .*",
        ),
        (
            "A7.3",
            _mutant(OUT_OF_PLACE),
            rf"FAIL {rs}rank 0's gathered weights are in the tensor "
            r"you returned, not in flat: fill flat in place .*",
        ),
        (
            "A7.3",
            _mutant(WHOLE_MESSAGES),
            rf"FAIL {rs}rank 0 sent 2 messages / 280 bytes; the "
            r"allgather sends 2 messages of one chunk each, 92 bytes .*",
        ),
        (
            "A7.4",
            _mutant(SUM),
            rf"FAIL {step}rank 0's weights are those of Adam on the sum of the "
            r"3 ranks' gradients, not their mean: divide the reduced shard by N = 3 .*",
        ),
        (
            "A7.4",
            _mutant(WHOLE_STATE),
            rf"FAIL {step}the ledger counts 13\d bytes of optimiser "
            r"state for the bucket of 16 values on rank 0: a rank that keeps the whole optimiser "
            r"state \(128 bytes for Adam's m and v\) is not stage 2; .*",
        ),
        (
            "A7.4",
            _mutant(RING_ALLREDUCE),
            rf"FAIL {step}rank 0 sent 36 messages / \d+ bytes; the "
            r"stage-2 step .* sends 24 messages of one chunk each, \d+ bytes .*an allreduce where a "
            r"reduce-scatter does .*",
        ),
        (
            "A7.4",
            floor,
            rf"FAIL {step}rank \d sent 24 messages / \d+ bytes; the stage-2 step .*"
            r"\(shards of m // N values with the rest on the last rank: cut the bucket by "
            r"chunk_bounds\(m, N\), whose first m % N shards hold one value more\)",
        ),
        (  # the reduce-scatter and the update, but no allgather: stale weights on every rank
            "A7.4",
            _mutant(NO_GATHER),
            rf"FAIL {step}rank 0 sent 12 messages, one pass a bucket and step: after the shard's "
            r"update every rank needs the whole updated weights \(allgather them\), .*",
        ),
    ]
    for exercise, namespace, pattern in expected:
        got = _run(exercise, namespace[NAMES[exercise]], cluster)
        assert re.fullmatch(pattern, got), (exercise, pattern, got)


def test_the_judges_reference_is_one_process_and_the_rings_order_matters():
    # No engines: the ring's mean is the mean (to float32's rounding), and A7.4's reference
    # (every rank's gradient, the ring's mean, Adam on each bucket) trains like one process on
    # the whole batch within the kit's data-parallel tolerance (tests/lib/sharded/test_sharded.py).
    import torch.nn.functional as F

    from course_grader.assignments.a7.collect import (
        ADAM_LR,
        bucket,
        global_batches,
        model_buckets,
        stage2_model,
    )
    from course_grader.assignments.a7.judge import a7_cases, reference_stage2, ring_mean

    parts = [bucket(35, 5, r) for r in range(3)]
    exact = torch.stack(parts).double().mean(0)
    assert torch.allclose(ring_mean(parts, 3).double(), exact, rtol=1e-6, atol=1e-7)
    assert not torch.equal(ring_mean(parts, 3), sum(parts) * (1 / 3))  # bit for bit is strict
    case = a7_cases("A7.4")[0]
    model = stage2_model(case["model_seed"])
    optimizer = torch.optim.Adam(model.parameters(), lr=ADAM_LR)
    for X, y in global_batches(case["seed"]):
        optimizer.zero_grad()
        F.cross_entropy(model(X), y).backward()
        optimizer.step()
    one = [torch.cat([p.detach().reshape(-1) for p in b]) for b in model_buckets(model)]
    for got, want in zip(reference_stage2(case, 3), one, strict=True):
        assert torch.allclose(got, want, rtol=5e-6, atol=1e-7)
    start = [torch.cat([p.detach().reshape(-1) for p in b]) for b in model_buckets(stage2_model(7))]
    assert not any(torch.equal(s, w) for s, w in zip(start, one, strict=True))  # it trained
