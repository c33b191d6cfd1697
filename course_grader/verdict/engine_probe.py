"""No lecture (the grader). The probes of an assignment answered on engines, its bytes audited (A2, A4, A6, A7).

Every exercise of such an assignment has the same probe: the kernel runs the answer on its
engines, case by case, and prints every rank's data; the grader replays that data into the
notebook's own judge (its ``body``), on its own copy of the inputs, and holds what the ranks
reported sending against the bytes on the wire (:mod:`course_grader.verdict.claims`). The
engines' communicators run on ``torch.distributed`` (gloo), so torch stays importable, and the
kernel sees the kit without its checks (the references). Two ways to reach the engines:

- :func:`pushed_spec` (A2, A4): the kernel pushes the answer to the engines under its own name
  and calls it there through its own ``engine_case``, one kind of case per exercise;
- :func:`collect_spec` (A6, A7): the kernel ships the answer by value (cloudpickle) with the
  source of the assignment's ``collect`` module, which each engine runs on its communicator.
"""

from __future__ import annotations

import base64
import functools
import inspect
from collections.abc import Callable, Mapping
from types import ModuleType

from course_grader.verdict.claims import PER_PAIR, Claims
from course_grader.verdict.probe import ExerciseProbe, ProbeSpec
from course_lib.checks.verdict import Verdict, run_check

__all__ = ["collect_spec", "engine_spec", "pushed_spec"]

ClaimsOf = Callable[[list], Claims | list[Claims]]
#: (exercise, replayed answer, seed) -> the PASS detail; raises AssertionError at a wrong rank
Body = Callable[[str, Callable, int], str]

# The kernel's code for :func:`collect_spec`: ``run_case(fn, case)`` runs ``collect`` on every
# engine, from the module's source (the module itself is hidden from the kernel and its engines).
_COLLECT_SETUP = """\
    import cloudpickle

    source = base64.b64decode("{source}").decode()

    def engine_case(blob, source, case):
        import cloudpickle
        from IPython import get_ipython

        ns = {{"__name__": "{module}"}}  # collect, as source: the module is hidden
        exec(source, ns)
        return ns["collect"](get_ipython().user_ns["comm"], cloudpickle.loads(blob), case)

    def run_case(fn, case):
        assert cluster.world_size == 3, f"the check needs 3 engines, not {{cluster.world_size}}"
        return cluster.run(engine_case, cloudpickle.dumps(fn), source, case, timeout=120)
"""


def _check(exercise: str, name: str, body: Body, max_points: float) -> Callable[..., Verdict]:
    """A check over the replayed engines' data: the notebook's own body, on the grader's seed."""

    def check(answer: Callable, *, verbose: bool = False, seed: int = 0) -> Verdict:
        return run_check(
            exercise,
            name,
            lambda: body(exercise, answer, seed),
            max_points=max_points,
            verbose=verbose,
        )

    return check


def engine_spec(
    calls: Mapping[str, tuple[str, str]],
    setup: Mapping[str, str],
    *,
    inputs: Callable[[str, int], list[dict]],
    body: Body,
    points: Mapping[str, float],
    claims: Mapping[str, ClaimsOf],
    wire_slack: Mapping[str, int] | None = None,
    kit_cut: tuple[str, ...] = (),
) -> ProbeSpec:
    """Return the spec of an assignment whose answers run on engines, their bytes audited.

    Args:
        calls: exercise -> (the answer's name, the kernel's call per ``case``).
        setup: exercise -> the kernel code defined before the calls (indented 4).
        inputs: ``inputs(exercise, seed)``: the exercise's cases on the grader's seed.
        body: the notebook's judge of an exercise, over the replayed answer.
        points, claims, wire_slack: per exercise, the points, what the ranks' data claim was
            sent, and the bytes a pair may carry beyond the claims (default :data:`PER_PAIR`).
        kit_cut: the kit's functions the kernel sees only as stubs (``ProbeSpec.kit_cut``).
    """
    probes = {
        exercise: ExerciseProbe(
            functools.partial(inputs, exercise),
            call,
            _check(exercise, name, body, points[exercise]),
            setup[exercise],
            claims=claims[exercise],
            wire_slack=PER_PAIR if wire_slack is None else wire_slack[exercise],
        )
        for exercise, (name, call) in calls.items()
    }
    return ProbeSpec("", probes, blocked=False, kit=True, kit_cut=kit_cut)


def pushed_spec(
    exercises: Mapping[str, tuple[str, str]],
    call: str,
    setup: str,
    *,
    inputs: Callable[[str, int], list[dict]],
    body: Body,
    points: Mapping[str, float],
    claims: ClaimsOf,
    wire_slack: Mapping[str, int],
    kit_cut: tuple[str, ...] = (),
) -> ProbeSpec:
    """The spec of an assignment whose kernel pushes each answer to the engines by name (A2, A4).

    ``exercises``: exercise -> (the answer's name, the kind of its cases); ``call`` and
    ``setup`` are templates of ``{name}``; ``inputs(kind, seed)`` draws a kind's cases.
    """
    return engine_spec(
        {exercise: (name, call.format(name=name)) for exercise, (name, _) in exercises.items()},
        {exercise: setup.format(name=name) for exercise, (name, _) in exercises.items()},
        inputs=lambda exercise, seed: inputs(exercises[exercise][1], seed),
        body=body,
        points=points,
        claims=dict.fromkeys(exercises, claims),
        wire_slack=wire_slack,
        kit_cut=kit_cut,
    )


def collect_spec(
    collect: ModuleType,
    calls: Mapping[str, tuple[str, str]],
    *,
    inputs: Callable[[str, int], list[dict]],
    body: Body,
    points: Mapping[str, float],
    claims: Mapping[str, ClaimsOf],
    kit_cut: tuple[str, ...] = (),
) -> ProbeSpec:
    """The spec of an assignment whose engines run ``collect`` on the answer (A6, A7).

    ``calls``: exercise -> (the answer's name, the expression of what the engines call, the
    answer or a tuple of answers); every engine returns ``collect(comm, answer, case)``.
    """
    source = base64.b64encode(inspect.getsource(collect).encode()).decode()
    module = "course_probe_" + collect.__name__.split(".")[-2]  # course_probe_a6, ...
    setup = _COLLECT_SETUP.format(source=source, module=module)
    return engine_spec(
        {exercise: (name, f"run_case({fn}, case)") for exercise, (name, fn) in calls.items()},
        dict.fromkeys(calls, setup),
        inputs=inputs,
        body=body,
        points=points,
        claims=claims,
        kit_cut=kit_cut,
    )
