"""A7's checks on real engines: the instructor's answers pass; stubs and the tempting wrong answers
fail with the verdict that names the mistake. Above all: hooks that keep every full gradient
until the end of backward store the right shards and fail the memory ledger, named; so do hooks
that reduce every bucket only once backward is over. Also a sum for a mean, an allreduce, hooks
that do not count afresh each pass, the whole optimiser state, a fresh optimiser each step, no
gather and an allreduce that gathers. Every check is seen failing."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
import torch

from course_grader.assignments.a7.checks import A7_POINTS, check_shard_update, check_stage2_hooks
from course_grader.cells import answer_id
from course_lib.comm import chunk_bounds

SOURCE = Path(__file__).resolve().parents[3] / "assignments" / "source" / "A7_zero_stage2.ipynb"
ANSWERS = {
    answer_id(c): c.source for c in nbformat.read(SOURCE, as_version=4).cells if answer_id(c)
}
NAMES = {"A7.1": "attach_stage2_hooks", "A7.2": "update_shard"}
CHECKS = {"A7.1": check_stage2_hooks, "A7.2": check_shard_update}


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


# -- A7.1's usual mistakes ----------------------------------------------------------------------
FREE = "                for p in buckets[b]:\n                    p.grad = None  # the full-size gradients go ...\n"
KEEP_GRADS = ("A7.1", FREE, "")  # reduce-scatter each bucket in time, but never free .grad
SUM = ("A7.1", "comm.reduce_scatter(flat) / n", "comm.reduce_scatter(flat)")
ALLREDUCE = (  # every rank the whole bucket's mean, then its slice
    "A7.1",
    "shards[b] = comm.reduce_scatter(flat) / n",
    "lo, hi = chunk_bounds(flat.numel(), n)[comm.rank]\n"
    "                shards[b] = (comm.allreduce(flat) / n)[lo:hi].clone()",
)
NO_RESET = ("A7.1", "                arrived[b] = 0  # the next backward pass counts afresh\n", "")
VIEW = (  # the shard as a view of a full-size mean: the whole bucket stays alive
    "A7.1",
    "shards[b] = comm.reduce_scatter(flat) / n",
    "lo, hi = chunk_bounds(flat.numel(), n)[comm.rank]\n"
    "                whole = torch.zeros_like(flat)\n"
    "                whole[lo:hi] = comm.reduce_scatter(flat) / n\n"
    "                shards[b] = whole[lo:hi]",
)
AT_THE_END = '''
def attach_stage2_hooks(comm, buckets, shards):
    """Stage 1's timing: wait for the whole backward, then reduce and free every bucket."""
    n = comm.world_size
    arrived = [0]
    total = sum(len(params) for params in buckets)

    def hook(param):
        arrived[0] += 1
        if arrived[0] < total:
            return
        arrived[0] = 0
        for b, params in enumerate(buckets):
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            for p in params:
                p.grad = None
            shards[b] = comm.reduce_scatter(flat) / n

    for params in buckets:
        for p in params:
            p.register_post_accumulate_grad_hook(hook)
'''

# -- A7.2's usual mistakes ----------------------------------------------------------------------
WHOLE_STATE = (
    "A7.2",
    """    if "optimizer" not in state:  # the first call: Adam over a view of this rank's slice only
        state["shard"] = torch.nn.Parameter(flat_params[lo:hi])  # shares flat_params' memory
        state["optimizer"] = torch.optim.Adam([state["shard"]], lr=lr)  # m, v: shard-sized
    state["shard"].grad = grad_shard
""",
    """    if "optimizer" not in state:  # Adam over the whole bucket: m and v of every value
        state["shard"] = torch.nn.Parameter(flat_params)
        state["optimizer"] = torch.optim.Adam([state["shard"]], lr=lr)
    state["shard"].grad = torch.zeros_like(flat_params)
    state["shard"].grad[lo:hi] = grad_shard
""",
)
FRESH = ("A7.2", 'if "optimizer" not in state:', "if True:")
NO_GATHER = (
    "A7.2",
    "    every = comm.allgather(mine)\n    for q, (a, b) in enumerate(bounds):\n",
    "    for q, (a, b) in enumerate([]):\n",
)
GATHER_BY_ALLREDUCE = (
    "A7.2",
    "    every = comm.allgather(mine)\n",
    "    every = torch.zeros(n, widest)\n    every[comm.rank] = mine\n    comm.allreduce(every)\n",
)


@pytest.mark.slow
def test_a7_checks_pass_the_source_and_fail_stubs_and_the_usual_mistakes(cluster):
    sol = _define(ANSWERS)
    for exercise, name in NAMES.items():
        assert re.match(r"PASS 3 ranks", _run(exercise, sol[name], cluster)), exercise
        assert _run(exercise, stub, cluster).startswith("FAIL not implemented yet: Exercise A7.x")

    hooks = r"3 buckets \(12, 40, 35 values\) on 3 ranks, 2 backward passes: "
    upd = r"a bucket of 35 values on 3 ranks \(12, 12, 11\), 3 steps: "
    stage1 = (
        r"the shards are right, but rank 0's memory ledger still held bucket 0's full-size "
        r"gradients \(48 bytes\) when bucket 1's were produced: every full gradient kept until "
        r"the end of backward, stage 1's memory \(a peak of \d+ bytes of full-size gradients, "
        r"348 for all 3 buckets\); stage 2 frees .*"
    )
    expected = [
        ("A7.1", _mutant(KEEP_GRADS), rf"FAIL {hooks}{stage1}"),
        ("A7.1", _replaced("A7.1", AT_THE_END), rf"FAIL {hooks}{stage1}"),
        (
            "A7.1",
            _mutant(SUM),
            rf"FAIL {hooks}after the first backward pass, shards\[0\] \(bucket 0, 12 values\) on "
            r"rank 0 is the sum over the 3 ranks, not their mean: .*",
        ),
        (
            "A7.1",
            _mutant(ALLREDUCE),
            rf"FAIL {hooks}rank 0 called comm.allreduce: an allreduce leaves every rank the whole "
            r"bucket's sum, .*",
        ),
        (
            "A7.1",
            _mutant(NO_RESET),
            rf"FAIL {hooks}after a second backward pass, shards\[0\] \(bucket 0, 12 values\) was "
            r"missing on rank 0, though the first pass stored it: .*",
        ),
        (
            "A7.1",
            _mutant(VIEW),
            rf"FAIL {hooks}the shards are right, but on rank 0 the shards dict holds 348 bytes "
            r"where its shards are 120: .*",
        ),
        (
            "A7.2",
            _mutant(WHOLE_STATE),
            rf"FAIL {upd}the ledger counts 28\d bytes of optimiser state on rank 0 \(the whole "
            r"bucket's\); a rank that keeps the whole optimiser state is not stage 2: .*",
        ),
        (
            "A7.2",
            _mutant(FRESH),
            rf"FAIL {upd}rank 0's updates are each a first Adam step: .*",
        ),
        (
            "A7.2",
            _mutant(NO_GATHER),
            rf"FAIL {upd}on rank 0 the shards of ranks \[1, 2\] are the weights before the step: .*",
        ),
        (
            "A7.2",
            _mutant(GATHER_BY_ALLREDUCE),
            rf"FAIL {upd}rank 0 called comm.allreduce: an allreduce that gathers sends twice .*",
        ),
    ]
    for exercise, namespace, pattern in expected:
        got = _run(exercise, namespace[NAMES[exercise]], cluster)
        assert re.fullmatch(pattern, got), (exercise, pattern, got)


def test_the_judges_mean_is_the_ranks_mean_and_one_process_trains_the_same():
    # No engines: A7.1's reference (the mean of the ranks' gradients, each of its own 4 samples)
    # is the gradient of one process on the 12 samples, and the buckets are backward's order.
    import torch.nn.functional as F

    from course_grader.assignments.a7.collect import hook_model, model_buckets, rank_batch
    from course_grader.assignments.a7.judge import a7_cases, mean_gradients

    case = a7_cases("A7.1")[0]
    model = hook_model(case["model_seed"])
    assert [sum(p.numel() for p in b) for b in model_buckets(model)] == [12, 40, 35]
    batches = [rank_batch(case["seed"], 1, r) for r in range(3)]
    X, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    F.cross_entropy(model(X), y).backward()
    whole = [torch.cat([p.grad.reshape(-1) for p in b]) for b in model_buckets(model)]
    means, own = mean_gradients(case, 3, 1)
    for got, want in zip(means, whole, strict=True):
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(own[0][0], whole[0])  # one rank's gradient is not the mean


def test_the_stub_messages_do_not_state_the_answer():
    from course_grader.release import release_notebook

    released = release_notebook(nbformat.read(SOURCE, as_version=4), "A7")
    stubs = [c.source for c in released.cells if answer_id(c)]
    assert len(stubs) == 2
    for code in stubs:
        message = re.search(r'NotImplementedError\("([^"]*)"\)', code)[1]
        for answer in ("reduce_scatter", "grad = None", "hook", "Parameter", "Adam", "allgather",
                       "chunk_bounds", "pad", "/ n", "state"):  # fmt: skip
            assert answer not in message, (answer, message)
