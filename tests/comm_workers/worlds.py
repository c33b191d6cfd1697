"""Worlds shared by a module's tests: one launch runs the suites of several tests in turn.

Starting a world costs each rank a Python and torch's import (~2 s of CPU), more than most
suites' own work, so the suites that leave a world healthy share one, and a suite that breaks
its world (timeouts, mismatched messages: gloo closes its connections) ends it. A suite that
fails fails alone: the suites before it keep their results, and the ones after it run on a fresh
world when a test asks for them. Each test gets its own suite's results whichever test asked
first, so no test depends on another's order or outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from comm_workers.launch import launch_suites

__all__ = ["Worlds"]

Group = tuple[str, ...]  # suites run in this order on one world; only the last may break it


class Worlds:
    """Launch each group of suites once per (backend, n), on first demand; keep the results."""

    def __init__(
        self,
        groups: Iterable[Group],
        wanted: Callable[[str, int, str], bool] = lambda backend, n, suite: True,
        launch: Callable = launch_suites,
    ) -> None:
        self.groups = [tuple(g) for g in groups]
        self.wanted = wanted  # a suite no selected test asks for is left out of the launch
        self.launch = launch
        self.results_of: dict[tuple[str, int, str], list[dict]] = {}
        self.failure_of: dict[tuple[str, int, str], str] = {}
        self.launches: list[tuple[str, int, tuple[str, ...]]] = []  # what ran, for the tests

    def results(self, backend: str, n: int, suite: str) -> list[dict]:
        """Return every rank's result of ``suite`` on ``n`` ranks; AssertionError if it failed."""
        key = (backend, n, suite)
        group = next((g for g in self.groups if suite in g), None)
        if group is None:
            raise ValueError(f"suite {suite!r} is in no group of this module's worlds")
        while key not in self.results_of and key not in self.failure_of:
            todo = [
                s
                for s in group
                if (backend, n, s) not in self.results_of
                and (backend, n, s) not in self.failure_of
                and (s == suite or self.wanted(backend, n, s))
            ]
            self.launches.append((backend, n, tuple(todo)))
            done, failure = self.launch(backend, n, todo)
            for s, res in done.items():
                self.results_of[(backend, n, s)] = res
            if failure is not None:  # the first suite not done failed; later ones did not run
                self.failure_of[(backend, n, todo[len(done)])] = failure
        if key in self.failure_of:
            raise AssertionError(self.failure_of[key])
        return self.results_of[key]
