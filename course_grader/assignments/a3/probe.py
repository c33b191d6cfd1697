"""A3 graded out of the kernel's reach: the kernel and its engines return data, the grader decides.

For A3.1 and A3.3 the kernel runs :func:`course_grader.assignments.a3.engine.kernel_case`:
every rank calls the answer once on gradients drawn from the grader's fresh seed and returns what
it holds and what its communicator counted (built-in collectives, bytes per peer); then 4 engines
train with the answer inside the kit's data-parallel seam, from initial weights and a batch order
drawn from the same seed, and the kernel returns rank 0's weights, the replica check and each
step's bytes. For A3.2 the kernel calls ``bucket_layout`` on the grader's layouts and returns the
buckets (or whether a bad size raised ValueError). The grader re-derives the gradients and trains
the one-process reference itself, and judges with :mod:`course_grader.assignments.a3.judge`
and :mod:`course_grader.assignments.a3.checks`'s own judges, in its own process. The kernel sees the
kit the engines need and, of ``course_lib.checks``, only ``a3_engine`` (which collects data and
decides nothing): not the judges, the references or the verdicts.

The counters and the training run's records are counted inside the student's processes (the
engines), so the grader also counts the bytes between the ranks on the wire, outside the sandbox,
and they must agree with every rank's counts (:func:`a3_claims`,
:mod:`course_grader.verdict.wire`): the probe calls' messages, and the training run's
broadcast of rank 0's weights, its barriers and the answer's messages, step after step. An answer
that averages with a built-in and rewrites ``comm.stats`` to say it sent messages fails there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from course_grader.verdict.claims import Claims, ClaimsBuilder
from course_grader.verdict.probe import ExerciseProbe, ProbeSpec
from course_lib.checks.verdict import Verdict, run_check
from course_lib.i18n import _

__all__ = ["KIT_CUT", "a3_cases", "a3_claims", "a3_spec", "kit_hidden", "training_layout"]

WORLD_SIZE = 4
#: The set-up cell of the graded copy: the instructor's, without the checks' module.
KERNEL_SETUP = """\
import numpy as np

from course_grader.assignments.a3.engine import prepare_engines
from course_lib.cluster import start_cluster

cluster = start_cluster(n=4)
cluster.view.execute("import numpy as np")
prepare_engines(cluster)  # the communicators and the training code on every engine
"""
_ENGINE_SETUP = "    from course_grader.assignments.a3.engine import kernel_case\n"
_LAYOUT_SETUP = """\
    def layout_case(fn, case):
        if case["bad"]:
            try:
                fn([3, 4], case["bucket_bytes"])
            except ValueError:
                return "ValueError"
            return "no error"
        got = fn([int(s) for s in case["sizes"]], case["bucket_bytes"])
        return None if got is None else [[int(i) for i in b] for b in got]
"""
#: What the kernel may see of the grader: the packages on the way and the data collector.
_VISIBLE = (
    "course_grader/__init__.py",
    "course_grader/assignments/__init__.py",
    "course_grader/assignments/a3/__init__.py",
    "course_grader/assignments/a3/engine.py",
)


def kit_hidden() -> tuple[str, ...]:
    """The lecture checks and every file of the grader (as paths under the checkout) but A3's collector."""
    import course_grader

    grader = Path(course_grader.__file__).resolve().parent
    hidden = ["course_lib/checks"]
    for path in sorted(grader.rglob("*")):
        part = f"course_grader/{path.relative_to(grader).as_posix()}"
        if path.name == "__pycache__" or (path.is_file() and "__pycache__" not in part):
            if part not in _VISIBLE:
                hidden.append(part)
    return tuple(hidden)


def training_layout(bucket_bytes: int) -> list[list[int]]:
    """The buckets of A3's training network, laid out by the grader (the kernel's kit has no rule)."""
    from course_grader.assignments.a3.engine import A3Net
    from course_lib.parallel.exchanges.base import trainable_parameters
    from course_lib.parallel.exchanges.buckets import bucket_layout

    return bucket_layout(trainable_parameters(A3Net()), bucket_bytes)


def a3_cases(kind: str, seed: int) -> list[dict]:
    """A3's cases for ``kind`` ("ps", "layout", "bucket") on the grader's seed."""
    from course_grader.assignments.a3 import checks as a3

    if kind == "layout":
        bad = [{"bad": 1, "bucket_bytes": b} for b in a3.BAD_BUCKET_BYTES]
        return bad + [
            {"bad": 0, "sizes": [int(s) for s in sizes], "bucket_bytes": int(cap)}
            for sizes, cap in a3.layout_cases(seed)
        ]
    if kind == "ps":
        cases, options = a3.PS_CASES, {"server": a3.TRAIN_SERVER}
    else:
        cases = [(size, 0) for size in a3.PROBE_SIZES]
        options = {"bucket_bytes": a3.BUCKET_BYTES, "layout": training_layout(a3.BUCKET_BYTES)}
    probes = [{"run": "probe", "size": s, "server": r, "seed": seed} for s, r in cases]
    return [*probes, {"run": "train", "train_seed": seed % 10_000, **options}]


def _judge_probe(kind: str, case: dict, ranks: Any) -> None:
    """Raise AssertionError with the first rank's problem, in rank order, as the notebook does."""
    from course_grader.assignments.a3.engine import probe_gradients
    from course_grader.assignments.a3.judge import judge_probe

    if not isinstance(ranks, list) or not ranks or not isinstance(ranks[0], tuple):
        raise AssertionError(_("the engines returned no result"))
    by_rank = {int(r[0]): r for r in ranks}
    if len(ranks) != WORLD_SIZE or sorted(by_rank) != list(range(WORLD_SIZE)):
        raise AssertionError(_("the engines' results do not come one from each rank"))
    grads = probe_gradients(case["size"], WORLD_SIZE, case["seed"])  # the grader's own copy
    for rank in range(WORLD_SIZE):
        _rank, n, got, builtins, sent, received = by_rank[rank][:6]
        if int(n) != WORLD_SIZE:
            raise AssertionError(_("A3 needs 4 engines, not {n}").format(n=int(n)))
        if isinstance(got, str):  # not data: the decoder says which type it was
            raise AssertionError(
                _("rank {rank} returned {got}, not an array").format(rank=rank, got=got)
            )
        why = judge_probe(
            kind,
            case["size"],
            case["server"],
            rank,
            grads,
            got,
            [str(b) for b in builtins],
            {int(q): int(nbytes) for q, nbytes in sent},
            {int(q): int(nbytes) for q, nbytes in received},
        )
        if why:
            raise AssertionError(why)


def _training_run(data: Any) -> dict:
    """The kernel's training data as ``a3_judge.judge_training`` takes it."""
    if not isinstance(data, tuple) or len(data) != 8:
        raise AssertionError(_("the training run returned no result"))
    world_size, equal, difference, gradient_bytes, flag_bytes, weights, records, _c = data
    return {
        "world_size": int(world_size),
        "replicas_equal": bool(equal),
        "max_replica_difference": float(difference),
        "gradient_bytes": int(gradient_bytes),
        "flag_bytes": int(flag_bytes),
        "weights": {str(name): np.asarray(w) for name, w in weights},
        "records": [
            dict(
                zip(("rank", "step", "bytes_sent", "collective_bytes"), map(int, rec), strict=True)
            )
            for rec in records
        ],
    }


def _engine_check(exercise: str, name: str, kind: str):
    from course_grader.assignments.a3 import checks as a3
    from course_grader.assignments.a3.judge import judge_training

    detail = a3.ps_detail if kind == "ps" else a3.bucket_detail

    def check(answer, *, verbose: bool = False, seed: int = 0) -> Verdict:
        def body() -> str:
            steps = 0
            for case in a3_cases(kind, seed):  # the grader's own copy of the inputs
                data = answer(case)
                if case["run"] == "probe":
                    _judge_probe(kind, case, data)
                else:
                    options = {k: case[k] for k in ("server", "bucket_bytes") if k in case}
                    steps = judge_training(kind, _training_run(data), options, seed)
            return detail(steps)

        return run_check(exercise, name, body, max_points=a3.A3_POINTS[exercise], verbose=verbose)

    return check


def _check_layout(answer, *, verbose: bool = False, seed: int = 0) -> Verdict:
    from course_grader.assignments.a3 import checks as a3

    def body() -> str:
        cases = a3_cases("layout", seed)
        for case in cases:
            got = answer(case)
            if case["bad"]:
                a3.judge_bad_size(case["bucket_bytes"], got == "ValueError")
                continue
            if got is not None and not (
                isinstance(got, list) and all(isinstance(b, list) for b in got)
            ):
                raise AssertionError(
                    _("bucket_layout returned {got}, not a list of lists").format(got=got)
                )
            buckets = None if got is None else [[int(i) for i in b] for b in got]
            a3.judge_layout(case["sizes"], case["bucket_bytes"], buckets)
        return a3.layout_detail(len(cases) - len(a3.BAD_BUCKET_BYTES))

    return run_check(
        "A3.2", "bucket_layout", body, max_points=a3.A3_POINTS["A3.2"], verbose=verbose
    )


def a3_claims(cases: list) -> list[Claims]:
    """What the ranks reported sending, summed over the cases (:meth:`ClaimsBuilder.alternatives`).

    A probe call returns every rank's data, its counts (``comm.stats.as_rows()``) last; the
    training run returns each rank's counts of the set-up (the broadcast of rank 0's weights)
    and of the steps (the answer's messages, the seam's barriers), last.
    """
    claims = ClaimsBuilder()
    for data in cases:
        if isinstance(data, list):  # a probe call, every rank's line
            for line in data:
                used, p2p = line[6]
                claims.counts(int(line[0]), int(line[1]), used, p2p)
            continue
        _agree_with_records(data[6], data[7])
        claims.training_run(data[7])  # the training run
    return claims.alternatives()


def _agree_with_records(records: list, counters: list) -> None:
    """Raise ValueError unless each rank's counts of the steps add up to its step records.

    The judge reads the records, the wire check the counts: both come from the answer's
    process, so they must say the same (a count moved out of the records, or into a built-in
    the judge does not see, would otherwise pass both)."""
    for rank, (_setup, (used, p2p)) in enumerate(counters):
        mine = [rec for rec in records if int(rec[0]) == rank]
        sent = sum(int(row[2]) for row in p2p)
        built_in = sum(int(nbytes) for _name, _calls, nbytes in used)
        if (sent, built_in) != (sum(int(r[2]) for r in mine), sum(int(r[3]) for r in mine)):
            raise ValueError(
                f"rank {rank}'s counts of the training run ({sent} bytes sent, {built_in} in "
                "built-ins) disagree with its step records"
            )


#: The kit's own answers to A3: the parameter server's average, DDP's bucket rule. Its kernel's
#: kit has them only as stubs (course_grader.sandbox.kit_cut); the rest of the kit works as ever.
#: The ring allreduce (A3.3's bucket average) stays: the kit's exchanges agree on their layout
#: with it (bucket_choice.agree_on_layout), and A3.3's training runs through them.
KIT_CUT = (
    "course_lib.parallel.exchanges.parameter_server:ParameterServer.average",
    "course_lib.parallel.exchanges.buckets:bucket_layout",
)


def a3_spec() -> ProbeSpec:
    """A3's probes: the kernel runs the answers and trains, the grader judges the data."""
    engine_call = 'kernel_case(cluster, "{kind}", {name}, case)'
    exercises = {
        "A3.1": ExerciseProbe(
            lambda seed: a3_cases("ps", seed),
            engine_call.format(kind="ps", name="ps_average"),
            _engine_check("A3.1", "ps_average", "ps"),
            _ENGINE_SETUP,
            claims=a3_claims,
        ),
        "A3.2": ExerciseProbe(
            lambda seed: a3_cases("layout", seed),
            "layout_case(bucket_layout, case)",
            _check_layout,
            _LAYOUT_SETUP,
        ),
        "A3.3": ExerciseProbe(
            lambda seed: a3_cases("bucket", seed),
            engine_call.format(kind="bucket", name="bucket_average"),
            _engine_check("A3.3", "bucket_average", "bucket"),
            _ENGINE_SETUP,
            claims=a3_claims,
        ),
    }
    # Training runs on torch (the engines' gloo too): torch stays importable; of the checks the
    # kernel sees only the data collector.
    return ProbeSpec(
        KERNEL_SETUP, exercises, blocked=False, kit=True, kit_hidden=kit_hidden(), kit_cut=KIT_CUT
    )
