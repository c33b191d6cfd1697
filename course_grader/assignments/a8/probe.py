"""A8 graded out of the kernel's reach: what the kernel calls, what the grader checks.

The kernel (no ``course_lib``) calls the two answers on the grader's cases: A8.1's convolution
shapes, and A8.2's tables of predicted step times (the kit's simulator tabulated in the grader's
process, so the kernel's cost is a look-up) with the walk's random seed. The grader judges the
returned messages and (best, best_time, walk) with
:func:`course_grader.assignments.a8.checks.a8_body`, against the simulator, in its own process.
"""

from __future__ import annotations

from course_grader.verdict.probe import ExerciseProbe, ProbeSpec

__all__ = ["a8_spec"]

_SEARCH_SETUP = """\
    def a8_search(case):
        table = np.asarray(case["table"], dtype=float)

        def cost(strategy):
            return float(table[tuple(int(v) for v in strategy)])

        got = mh_search(cost, tuple(table.shape), tuple(case["start"]), case["beta"],
                        case["iterations"], np.random.default_rng(case["rng_seed"]))
        if isinstance(got, (tuple, list)) and len(got) == 3:  # the walk as one array
            got = (np.asarray(got[0]), got[1], np.asarray(got[2], dtype=float))
        return got
"""


_ROOM_SETUP = """\
    def a8_room(case):
        times, peaks = np.asarray(case["times"], dtype=float), np.asarray(case["peaks"], dtype=float)
        asked = set()

        def simulate(strategy):
            s = tuple(int(v) for v in strategy)
            if s not in asked:
                if len(asked) >= case["budget"]:
                    raise RuntimeError("budget spent: more than %d distinct strategies" % case["budget"])
                asked.add(s)
            return float(times[s]), float(peaks[s])

        return np.asarray(choose_strategy(simulate, tuple(times.shape), case["memory"], case["budget"],
                                          np.random.default_rng(case["rng_seed"])))
"""


def a8_spec() -> ProbeSpec:
    """A8's probes: the inputs and checks of :mod:`course_grader.assignments.a8.checks`."""
    from course_grader.assignments.a8 import checks as a8

    return ProbeSpec(
        kernel_setup="import math\n\nimport numpy as np\n",
        exercises={
            "A8.1": ExerciseProbe(
                lambda seed: a8.a8_cases("A8.1", seed),
                "halo_messages(**case)",
                a8.check_halo_messages,
            ),
            "A8.2": ExerciseProbe(
                lambda seed: a8.a8_cases("A8.2", seed),
                "a8_search(case)",
                a8.check_mh_search,
                _SEARCH_SETUP,
            ),
            "A8.3": ExerciseProbe(
                lambda seed: a8.a8_cases("A8.3", seed),
                "a8_room(case)",
                a8.check_choice,
                _ROOM_SETUP,
            ),
        },
    )
