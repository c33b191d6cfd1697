"""A8's checks (no kernel, no engines): the instructor's answers pass on the notebook's cases and
on other seeds; the released stub and the typical mistakes fail, each with a reason naming it;
the grader's probe decides from the kernel's data alone."""

from __future__ import annotations

import math
from pathlib import Path

import nbformat
import numpy as np
import pytest

from course_grader.assignments.a8.checks import (
    a8_cases,
    check_choice,
    check_halo_messages,
    check_mh_search,
)
from course_grader.assignments.a8.probe import a8_spec
from course_grader.cells import answer_id
from course_grader.verdict.probe import judge

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "assignments" / "source" / "A8_choosing_a_strategy.ipynb"
RELEASED = ROOT / "notebooks" / "assignments" / "A8_choosing_a_strategy.ipynb"


def _answer(path: Path, exercise: str) -> str:
    nb = nbformat.read(path, as_version=4)
    cell = next(c.source for c in nb.cells if answer_id(c) == exercise)
    return "\n".join(line for line in cell.splitlines() if "###" not in line)


def _define(code: str, name: str):
    namespace = {"np": np, "math": math}
    exec(code, namespace)
    return namespace[name]


def _mutant(exercise: str, name: str, *edits: tuple[str, str]):
    code = _answer(SOURCE, exercise)
    for old, new in edits:
        assert old in code, f"the solution of {exercise} no longer holds {old!r}"
        code = code.replace(old, new)
    return _define(code, name)


@pytest.mark.parametrize("seed", [None, 5])
def test_the_instructors_halo_passes_and_the_stub_fails(seed):
    answer = _define(_answer(SOURCE, "A8.1"), "halo_messages")
    verdict = check_halo_messages(answer, verbose=False, seed=seed)
    assert verdict.passed and verdict.points == verdict.max_points == 3, verdict
    stub = check_halo_messages(_define(_answer(RELEASED, "A8.1"), "halo_messages"), verbose=False)
    assert not stub.passed and stub.points == 0 and stub.detail.startswith("not implemented yet")


def _both_sides(batch, channels, height, width, kernel, padding, stride, workers):
    """A halo of k // 2 rows to both neighbours of every worker, edges included (no bounds)."""
    row, forward = 4 * batch * channels * width, []
    for j in range(workers):
        for other in (j - 1, j + 1):
            if kernel > 1:
                forward.append((j, other, kernel // 2 * row))
    return forward, [(d, s, b) for s, d, b in forward]


def _symmetric(batch, channels, height, width, kernel, padding, stride, workers):
    """A halo of k // 2 rows each side between neighbours: wrong without padding k // 2."""
    row, forward = 4 * batch * channels * width, []
    for j in range(workers - 1):
        if kernel > 1:
            forward += [(j, j + 1, kernel // 2 * row), (j + 1, j, kernel // 2 * row)]
    return forward, [(d, s, b) for s, d, b in forward]


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: _both_sides, "an edge worker has one neighbour only"),
        (lambda: _symmetric, "the halo is not k // 2 rows on each side"),
        (
            lambda: _mutant("A8.1", "halo_messages", ("row = 4 *", "row = 8 *")),
            "float64; the kit's activations and gradients are float32",
        ),
        (
            lambda: _mutant(
                "A8.1",
                "halo_messages",
                (
                    "backward = [(dst, src, nbytes) for src, dst, nbytes in forward]",
                    "backward = []",
                ),
            ),
            "no backward messages",
        ),
        (
            lambda: _mutant(
                "A8.1", "halo_messages", ("[(dst, src, nbytes) for", "[(src, dst, nbytes) for")
            ),
            "the backward messages go the wrong way",
        ),
    ],
    ids=["edge-both-sides", "k//2-each-side", "float64", "no-backward", "backward-reversed"],
)
def test_halo_mistakes_fail_naming_the_mistake(make, reason):
    verdict = check_halo_messages(make(), verbose=False)
    assert not verdict.passed and verdict.points == 0
    assert reason in verdict.detail, verdict.detail


@pytest.mark.parametrize("seed", [None, 3])
def test_the_instructors_search_passes_and_the_stub_fails(seed):
    answer = _define(_answer(SOURCE, "A8.2"), "mh_search")
    verdict = check_mh_search(answer, verbose=False, seed=seed)
    assert verdict.passed and verdict.points == verdict.max_points == 3, verdict
    stub = check_mh_search(_define(_answer(RELEASED, "A8.2"), "mh_search"), verbose=False)
    assert not stub.passed and stub.points == 0 and stub.detail.startswith("not implemented yet")


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (("math.exp(-beta *", "math.exp(beta *"), "accepting with exp(+beta delta)"),
        (("rng.random() < math.exp", "False and math.exp"), "no worse move is accepted"),
        (("rng.random() < math.exp", "rng.random() > math.exp"), "the Boltzmann weights"),
        (("return best, best_time, walk", "return current, t_cur, walk"), "not keeping the best"),
    ],
    ids=["exp-plus", "greedy", "1-minus-p", "last-not-best"],
)
def test_search_mistakes_fail_naming_the_mistake(edit, reason):
    verdict = check_mh_search(_mutant("A8.2", "mh_search", edit), verbose=False)
    assert not verdict.passed and verdict.points == 0
    assert reason in verdict.detail, verdict.detail


def _kernel_line(exercise: str, seed: int, code: str) -> str:
    """Run the probe the grader writes for ``exercise`` with ``code`` as the answer: its line."""
    import contextlib
    import io

    from course_grader.verdict.probe import probe_source

    source = probe_source(a8_spec().exercises[exercise], exercise, seed)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec("import math\nimport numpy as np\n" + code + "\n" + source, {})  # noqa: S102
    return out.getvalue()


@pytest.mark.parametrize(
    ("exercise", "name"),
    [("A8.1", "halo_messages"), ("A8.2", "mh_search"), ("A8.3", "choose_strategy")],
)
def test_the_grader_decides_from_the_kernels_data(exercise, name):
    spec, seed = a8_spec(), 11
    right = _kernel_line(exercise, seed, _answer(SOURCE, exercise))
    assert judge(spec, exercise, seed, right) == (True, "PASS")
    stub = _kernel_line(exercise, seed, _answer(RELEASED, exercise))
    passed, reason = judge(spec, exercise, seed, stub)
    assert not passed and "not implemented yet" in reason, reason
    # the cases a seed gives are the grader's: another seed's right answers do not pass
    if exercise == "A8.1":
        other = _kernel_line(exercise, seed + 1, _answer(SOURCE, exercise))
        assert a8_cases(exercise, seed) != a8_cases(exercise, seed + 1)
        assert not judge(spec, exercise, seed, other)[0]


def _fabricated(cost, choices, start, beta, iterations, rng):
    """Issue 35's attack: an exhaustive search, and a walk drawn to match exp(-beta t)."""
    import itertools

    every = list(itertools.product(*(range(n) for n in choices)))
    times = np.array([cost(s) for s in every])
    best = every[int(times.argmin())]
    weights = np.exp(-beta * (times - times.min()))
    walk = rng.choice(times, size=iterations, p=weights / weights.sum())
    return best, float(times.min()), list(walk)


def _every_u(cost, choices, start, beta, iterations, rng):
    """Metropolis-Hastings drawing u for every proposal (the other order the statement allows)."""
    current, t_cur = tuple(start), cost(start)
    best, best_time, walk = current, t_cur, []
    for _ in range(iterations):
        i = int(rng.integers(len(choices)))
        proposal = current[:i] + (int(rng.integers(choices[i])),) + current[i + 1 :]
        t_new, u = cost(proposal), rng.random()
        if t_new <= t_cur or u < math.exp(-beta * (t_new - t_cur)):
            current, t_cur = proposal, t_new
            best, best_time = (current, t_cur) if t_cur < best_time else (best, best_time)
        walk.append(t_cur)
    return best, best_time, walk


def test_a_fabricated_walk_fails_naming_where_it_leaves_the_chain():
    # Its frequencies match the Boltzmann weights, so the statistical test alone passed it.
    verdict = check_mh_search(_fabricated, verbose=False, seed=4)
    assert not verdict.passed and verdict.points == 0
    assert "not the Metropolis-Hastings chain of the grader's random stream" in verdict.detail
    assert "at iteration" in verdict.detail, verdict.detail


def test_both_orders_of_drawing_u_are_the_chain():
    verdict = check_mh_search(_every_u, verbose=False, seed=4)
    assert verdict.passed, verdict.detail


@pytest.mark.parametrize("seed", [None, 6])
def test_the_instructors_choice_passes_and_the_stub_fails(seed):
    answer = _define(_answer(SOURCE, "A8.3"), "choose_strategy")
    verdict = check_choice(answer, verbose=False, seed=seed)
    assert verdict.passed and verdict.points == verdict.max_points == 4, verdict
    stub = check_choice(_define(_answer(RELEASED, "A8.3"), "choose_strategy"), verbose=False)
    assert not stub.passed and stub.points == 0 and stub.detail.startswith("not implemented yet")


def _fastest_ignoring_memory(simulate, choices, memory, budget, rng):
    """The fastest strategy predicted, memory never looked at (searched with the right answer)."""
    answer = _define(_answer(SOURCE, "A8.3"), "choose_strategy")
    return answer(simulate, choices, float("inf"), budget, rng)


def _first_that_fits(simulate, choices, memory, budget, rng):
    """The first strategy found that fits, however slow: no search for speed."""
    while True:
        s = tuple(int(rng.integers(n)) for n in choices)
        if simulate(s)[1] <= memory:
            return s


def _exhaustive(simulate, choices, memory, budget, rng):
    """Every strategy simulated: more than the budget allows."""
    import itertools

    return min(itertools.product(*(range(n) for n in choices)), key=lambda s: simulate(s)[0])


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (_fastest_ignoring_memory, "the pick does not fit"),
        (_first_that_fits, "far slower than the best"),
        (_exhaustive, "budget spent"),
    ],
    ids=["does-not-fit", "far-slower", "over-budget"],
)
def test_a_pick_that_does_not_fit_or_is_far_slower_loses_its_points(answer, reason):
    verdict = check_choice(answer, verbose=False)
    assert not verdict.passed and verdict.points == 0
    assert reason in verdict.detail, verdict.detail


@pytest.mark.parametrize("path", [SOURCE, RELEASED], ids=["source", "released"])
def test_a8_1s_statement_leaves_the_needed_rows_to_the_student(path):
    # the interval [max(0, o0 s - p), min(H, (o1 - 1) s - p + k)) is the exercise's hard part
    nb = nbformat.read(path, as_version=4)
    statement = next(c.source for c in nb.cells if c.get("id") == "55eac166")
    assert "A8.1" in statement
    for formula in ("o_0 s - p", "(o_1 - 1)s - p + k", r"\max(0", r"\min(H"):
        assert formula not in statement, formula
