"""Check cells for lecture 0 (the cluster): run the student's function on real engines.

Exercise 0.1's check reads what the student's calls brought back from the engines (the
client's own record of every task it sent and every result it received): the partial sums
must come from the engines, so an answer that scatters the numbers and sums them in the
notebook, or gathers the parts back and sums them there, does not pass.
"""

from __future__ import annotations

import contextlib
import numbers
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from course_lib.checks.verdict import Verdict, run_check
from course_lib.i18n import _

__all__ = ["check_sum_of_squares", "numbers_in"]

PER_ENGINE = 4  # partial sums an engine may send back per call (one is enough)


def numbers_in(result: Any) -> list[float]:
    """Return every number in an engine's result (lists, tuples, ranges, arrays, dicts: flattened)."""
    if isinstance(result, bool) or result is None:
        return []
    if isinstance(result, numbers.Number):
        return [result]
    if isinstance(result, np.ndarray):
        return result.ravel().tolist() if result.dtype.kind in "iuf" else []
    if isinstance(result, dict):
        return numbers_in(list(result.values()))
    if isinstance(result, (list, tuple, range)):
        return [v for item in result for v in numbers_in(item)]
    return []  # an execute's reply, a string, an error: no numbers


@contextlib.contextmanager
def _replies(client: Any) -> Iterator[list[tuple[int | None, Any]]]:
    """Record ``(engine id, result)`` of every reply ``client`` receives while the block runs.

    The client's reply handlers are wrapped for the block only (an ``AsyncResult`` drops its
    results from the client once read, so the client keeps no record of its own). The result is
    read from the message itself, before the client hands it on.
    """
    from ipyparallel import serialize

    seen: list[tuple[int | None, Any]] = []
    handlers = client._queue_handlers
    originals = dict(handlers)

    def recorder(kind: str) -> Callable:
        def handle(msg: dict) -> None:
            engine = client._engines.get(msg.get("metadata", {}).get("engine"))
            result = None
            if kind == "apply_reply" and msg.get("content", {}).get("status") == "ok":
                try:
                    result = serialize.deserialize_object(list(msg["buffers"]))[0]
                except Exception:  # noqa: BLE001 - a reply we cannot read carries no sum
                    result = None
            seen.append((engine, result))
            originals[kind](msg)

        return handle

    for kind in ("apply_reply", "execute_reply"):
        handlers[kind] = recorder(kind)
    try:
        yield seen
    finally:
        handlers.update(originals)


def check_sum_of_squares(
    sum_of_squares_on_engines: Callable[[Any, int], int], view: Any, *, verbose: bool = True
) -> Verdict:
    """Exercise 0.1: the student's function must spread the work over ``view`` and sum correctly.

    The reference is the formula $\\sum_{i<N} i^2 = (N-1)N(2N-1)/6$, for three fixed $N$ and one
    random one (so a table of answers fails). The client records every task the call sent and
    every result that came back: every engine of ``view`` must have run a task, and the numbers
    the engines sent back must be a few partial sums adding up to the answer, so neither a sum
    computed in the notebook after a scatter nor a sum of the gathered parts passes.
    """
    client = view.client

    def body() -> str:
        sizes = (10, 1001, 3, random.SystemRandom().randrange(2_000, 50_000))
        for N in sizes:
            with _replies(client) as replies:
                first = len(client.history)
                got = sum_of_squares_on_engines(view, N)
                client.wait(list(client.history[first:]), timeout=30)  # results not awaited
            expected = (N - 1) * N * (2 * N - 1) // 6
            assert got == expected, _("N={N}: got {got}, expected {expected}").format(
                N=N, got=repr(got), expected=expected
            )
            ran = {engine for engine, _reply in replies}
            back = [v for _engine, result in replies for v in numbers_in(result)]
            idle = [rank for rank, eid in enumerate(view.targets) if eid not in ran]
            assert not idle, _(
                "N={N}: the right number, but the engines of ranks {idle} ran nothing; "
                "compute the squares there (scatter, then apply or execute)"
            ).format(N=N, idle=idle)
            if len(back) > PER_ENGINE * len(view):
                raise AssertionError(
                    _(
                        "N={N}: the right number, but {count} numbers came back from the "
                        "engines and the notebook added them up: let every engine sum the squares "
                        "of its part and send back one partial sum"
                    ).format(N=N, count=len(back))
                )
            if sum(back) != expected:
                raise AssertionError(
                    _(
                        "N={N}: the right number, but what came back from the engines adds up to "
                        "{total}: the sum was computed in the notebook; bring back each "
                        "engine's partial sum (pull or gather it, or return it from apply)"
                    ).format(N=N, total=sum(back))
                )
        return _("{n} engines, N in {sizes} and one random N, partial sums from each").format(
            n=len(view), sizes=sizes[:3]
        )

    return run_check("0.1", "sum_of_squares_on_engines", body, verbose=verbose)
