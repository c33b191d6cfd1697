"""No lecture (the grader). One runner for the check cells whose answers run on engines (A4, A6, A7).

A check cell asserts the engine count, runs the student's answer on every engine through
``cluster.run`` (a stub's ``NotImplementedError`` or a refused library call on an engine reads
as the notebook's own, :func:`course_lib.checks.verdict.reraise_stub`) and turns the outcome
into a verdict (:func:`course_lib.checks.verdict.run_check`). A6 and A7 ship the answer by value
(cloudpickle: notebook functions and their helpers) and judge every rank's data case by case.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from course_lib.checks.verdict import Verdict, reraise_stub, run_check

__all__ = [
    "cluster_run",
    "judge_ranks",
    "run_engine_check",
    "run_shipped_check",
    "shipped_case_runner",
]


def cluster_run(cluster: Any, task: Callable, *args: Any, timeout: float) -> Any:
    """Return ``cluster.run(task, *args)``; an engine's stub error is raised as the notebook's."""
    try:
        return cluster.run(task, *args, timeout=timeout)
    except Exception as exc:
        reraise_stub(exc)
        raise


def shipped_case_runner(
    cluster: Any, task: Callable, answer: Any, comm_name: str, *, timeout: float = 120
) -> Callable[[dict], Any]:
    """Return ``run_case(case)``: ``task(blob, case, comm_name)`` on every engine, where ``blob``
    is ``answer`` pickled by value (cloudpickle), so notebook functions travel with their helpers.
    """
    import cloudpickle

    blob = cloudpickle.dumps(answer)
    return lambda case: cluster_run(cluster, task, blob, case, comm_name, timeout=timeout)


def judge_ranks(
    cases: Iterable[dict],
    run_case: Callable[[dict], Any],
    judge_rank: Callable[[dict, int, int, Any], str],
    world_size: int,
) -> None:
    """Raise ``AssertionError`` at the first rank whose data ``judge_rank`` finds wrong.

    ``run_case(case)`` returns every rank's (rank, world size, data); ``judge_rank(case, rank,
    world_size, data)`` returns "" or what is wrong.
    """
    for case in cases:
        ranks = run_case(case)
        assert isinstance(ranks, list) and ranks, "the engines returned no result"
        results = sorted((int(r[0]), int(r[1]), r[2]) for r in ranks if len(r) == 3)
        got = results[0][1] if results else 0
        assert got == world_size, f"the check needs {world_size} engines, not {got}"
        want = list(range(world_size))
        assert [r[0] for r in results] == want, "the engines' results are not one per rank"
        for rank, _, data in results:  # the first rank with a problem names it
            why = judge_rank(case, rank, got, data)
            assert not why, why


def run_engine_check(
    exercise: str,
    name: str,
    cluster: Any,
    body: Callable[[], str],
    *,
    world_size: int,
    max_points: float,
    verbose: bool,
) -> Verdict:
    """Return the verdict of ``body()`` (the PASS detail) on exactly ``world_size`` engines."""

    def checked() -> str:
        have = cluster.world_size
        assert have == world_size, f"the check needs {world_size} engines, not {have}"
        return body()

    return run_check(exercise, name, checked, max_points=max_points, verbose=verbose)


def run_shipped_check(
    exercise: str,
    name: str,
    answer: Any,
    cluster: Any,
    comm_name: str,
    verbose: bool,
    *,
    body: Callable[[str, Callable[[dict], Any]], str],
    task: Callable,
    points: Mapping[str, float],
) -> Verdict:
    """Return the verdict of ``body(exercise, run_case)`` on 3 engines (A6, A7), ``run_case``
    running ``task`` on every engine with ``answer`` shipped by value (:func:`shipped_case_runner`).
    """

    def checked() -> str:
        return body(exercise, shipped_case_runner(cluster, task, answer, comm_name))

    max_points = points[exercise]
    return run_engine_check(
        exercise, name, cluster, checked, world_size=3, max_points=max_points, verbose=verbose
    )
