"""Lecture 13's exercise checks: the instructor's answer passes, the notebook's stub fails, and
each tempting mistake (or an answer that leans on the simulator) fails with a message naming it.

The stubs are read from the notebook's own cells, so what a student starts from is what is tested.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from lecture13_answers import my_accept, my_column_messages, my_pipeline_time

from course_lib.checks.lecture13 import (
    check_accept,
    check_column_messages,
    check_pipeline_time,
    column_messages_reference,
    pipeline_time_reference,
)
from course_lib.cost_model.alpha_beta import LinkModel

NOTEBOOK = Path(__file__).resolve().parents[3] / "notebooks" / "13_choosing_a_strategy.ipynb"


def notebook_stub(name: str):
    """Return the function ``name`` as the notebook's exercise cell defines it."""
    for cell in json.loads(NOTEBOOK.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and f"def {name}(" in source:
            namespace: dict = {}
            exec(compile(source, str(NOTEBOOK), "exec"), namespace)  # noqa: S102 - our own notebook
            return namespace[name]
    raise AssertionError(f"the notebook defines no {name}")


# ---- 13.1 ----------------------------------------------------------------------------------
def whole_input_messages(batch, n_in, n_out, world_size):
    """Mistake: every worker sends the whole input, not its own rows."""
    pairs = [(h, c) for h in range(world_size) for c in range(world_size) if h != c]
    return {p: 4 * batch * n_in for p in pairs}, {(c, h): 4 * batch * n_in for h, c in pairs}


def forward_only_messages(batch, n_in, n_out, world_size):
    """Mistake: the backward pass sends nothing."""
    return my_column_messages(batch, n_in, n_out, world_size)[0], {}


def with_self_messages(batch, n_in, n_out, world_size):
    """Mistake: a worker 'sends' its own rows to itself."""
    forward, backward = my_column_messages(batch, n_in, n_out, world_size)
    rows = 4 * batch // world_size * n_in
    return {**forward, (0, 0): rows}, backward


def via_the_simulator_messages(batch, n_in, n_out, world_size):
    """Delegation: ask the library's task graph."""
    return column_messages_reference(batch, n_in, n_out, world_size)


@pytest.mark.parametrize(
    "answer, reason",
    [
        (whole_input_messages, "holds only its own B/N rows"),
        (forward_only_messages, "no backward messages"),
        (with_self_messages, "sends to itself"),
        (via_the_simulator_messages, "calls the simulator"),
    ],
)
def test_column_messages_mistakes_fail_naming_the_mistake(answer, reason):
    verdict = check_column_messages(answer, verbose=False)
    assert not verdict and reason in str(verdict)


def test_column_messages_answer_passes_and_stub_fails():
    assert check_column_messages(my_column_messages, verbose=False)
    stub = check_column_messages(notebook_stub("my_column_messages"), verbose=False)
    assert not stub and "not implemented" in str(stub)


# ---- 13.2 ----------------------------------------------------------------------------------
def greedy_accept(t_cur, t_new, beta, rng):
    """Mistake: never accept a slower strategy."""
    return t_new <= t_cur


def flipped_accept(t_cur, t_new, beta, rng):
    """Mistake: the exponent's sign (a slower strategy is always accepted)."""
    return t_new <= t_cur or rng.random() < math.exp(beta * (t_new - t_cur))


def no_beta_accept(t_cur, t_new, beta, rng):
    """Mistake: a relative slowdown, beta forgotten."""
    return t_new <= t_cur or rng.random() < math.exp(-5 * (t_new - t_cur) / t_cur)


def strict_accept(t_cur, t_new, beta, rng):
    """Mistake: better strategies also drawn against exp(-beta |dt|)."""
    return rng.random() < math.exp(-beta * abs(t_new - t_cur))


def global_random_accept(t_cur, t_new, beta, rng):
    """Mistake: the module's generator instead of the seeded one."""
    import random

    return t_new <= t_cur or random.random() < math.exp(-beta * (t_new - t_cur))


@pytest.mark.parametrize(
    "answer, reason",
    [
        (greedy_accept, "greedy descent"),
        (flipped_accept, "accept every slower strategy"),
        (no_beta_accept, "depend on beta"),
        (strict_accept, "must always be accepted"),
        (global_random_accept, "draw only from the rng"),
    ],
)
def test_accept_mistakes_fail_naming_the_mistake(answer, reason):
    verdict = check_accept(answer, verbose=False)
    assert not verdict and reason in str(verdict)


def test_accept_answer_passes_and_stub_fails():
    assert check_accept(my_accept, verbose=False)
    stub = check_accept(notebook_stub("my_accept"), verbose=False)
    assert not stub and "not implemented" in str(stub)


# ---- 13.3 ----------------------------------------------------------------------------------
def _message(link, nbytes):
    return link.alpha + nbytes * link.beta


def no_samples_time(batch, n_in, n_out, costs, link):
    """Mistake: worker 0 is assumed to hold every sample already."""
    compute = sum(sum(v) for v in costs.values())
    return compute + 2 * _message(link, 4 * batch * n_out)


def whole_samples_time(batch, n_in, n_out, costs, link):
    """Mistake: the whole batch of samples travels."""
    return my_pipeline_time(batch, n_in, n_out, costs, link) + 4 * batch // 2 * n_in * link.beta


def with_labels_time(batch, n_in, n_out, costs, link):
    """Mistake: the labels' message added to the critical path."""
    return my_pipeline_time(batch, n_in, n_out, costs, link) + _message(link, 8 * batch // 2)


def via_the_simulator_time(batch, n_in, n_out, costs, link):
    """Delegation: ask the library's simulator."""
    return pipeline_time_reference(batch, n_in, n_out, costs, link)


@pytest.mark.parametrize(
    "answer, reason",
    [
        (no_samples_time, "loaded half of the samples"),
        (whole_samples_time, "only the other half travels"),
        (with_labels_time, "not on the critical path"),
        (via_the_simulator_time, "calls the simulator"),
    ],
)
def test_pipeline_time_mistakes_fail_naming_the_mistake(answer, reason):
    verdict = check_pipeline_time(answer, verbose=False)
    assert not verdict and reason in str(verdict)


def test_pipeline_time_answer_passes_and_stub_fails():
    assert check_pipeline_time(my_pipeline_time, verbose=False)
    stub = check_pipeline_time(notebook_stub("my_pipeline_time"), verbose=False)
    assert not stub and "not implemented" in str(stub)


def test_the_simulator_works_again_after_a_check():
    check_pipeline_time(via_the_simulator_time, verbose=False)  # switched off, then restored
    costs = {"linear": (1e-5, 1e-5), "loss": (1e-5, 1e-5)}
    assert pipeline_time_reference(16, 8, 4, costs, LinkModel(1e-4, 1e-8)) > 4e-5
