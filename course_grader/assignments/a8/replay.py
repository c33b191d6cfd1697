"""A8.2 judged on the chain itself: the grader replays the walk from the random stream it supplied.

The answer draws every random number from the generator the grader hands it
(``np.random.default_rng(case["rng_seed"])``), in the order the statement prescribes: the
operator ``i = rng.integers(len(choices))``, its configuration ``rng.integers(choices[i])``, then
``u = rng.random()`` for the acceptance (for every proposal, or for a worse one only: both are
Metropolis–Hastings). From the same seed the grader walks the chain itself, accepting exactly
when ``t_new <= t_cur`` or ``u < exp(-beta (t_new - t_cur))``, and holds the answer's walk
against it step by step. A walk made any other way (an exhaustive search plus a record written
to match the expected frequencies, issue 35) departs from the chain at some iteration, and the
verdict names that iteration: the current time, the proposal, ``u``, and what the rule says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from course_lib.i18n import _

__all__ = ["CONVENTIONS", "Step", "first_departure", "replay"]

#: When ``u`` is drawn: for every proposal, or only for a worse one (the short-circuit
#: ``t_new <= t_cur or rng.random() < ...``). Both are the same chain in law; each is replayed.
CONVENTIONS = ("every proposal", "a worse proposal only")


@dataclass(frozen=True)
class Step:
    """One iteration of the replayed chain: what was proposed, drawn and decided."""

    t_cur: float
    operator: int
    config: int
    t_new: float
    u: float | None
    accepted: bool


def replay(case: dict, convention: str = CONVENTIONS[0]) -> tuple[np.ndarray, list[Step]]:
    """Walk ``case``'s chain from its seed; return the walk (time after each iteration) and steps."""
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown convention {convention!r}; choose one of {CONVENTIONS}")
    table = np.asarray(case["table"], dtype=float)
    rng = np.random.default_rng(case["rng_seed"])
    current = tuple(int(v) for v in case["start"])
    t_cur, beta = float(table[current]), float(case["beta"])
    walk, steps = np.empty(case["iterations"]), []
    for k in range(case["iterations"]):
        i = int(rng.integers(table.ndim))
        c = int(rng.integers(table.shape[i]))
        proposal = current[:i] + (c,) + current[i + 1 :]
        t_new = float(table[proposal])
        u = None
        if convention == CONVENTIONS[0] or t_new > t_cur:
            u = float(rng.random())
        accepted = t_new <= t_cur or (u is not None and u < math.exp(-beta * (t_new - t_cur)))
        steps.append(Step(t_cur, i, c, t_new, u, accepted))
        if accepted:
            current, t_cur = proposal, t_new
        walk[k] = t_cur
    return walk, steps


def _agree(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)


def first_departure(walk, case: dict) -> str | None:
    """Return None when ``walk`` is the chain the case's random stream drives, else the reason."""
    walk = np.asarray(walk, dtype=float).reshape(-1)
    furthest, where = -1, None
    for convention in CONVENTIONS:
        ref, steps = replay(case, convention)
        if len(walk) != len(ref):
            return _(
                "the walk has {entries} entries for {iterations} iterations: record the "
                "current strategy's time after every iteration"
            ).format(entries=len(walk), iterations=len(ref))
        same = np.array([_agree(float(a), float(b)) for a, b in zip(walk, ref, strict=True)])
        if same.all():
            return None
        k = int(np.argmin(same))
        if k > furthest:
            furthest, where = k, (convention, steps[k], float(walk[k]), float(ref[k]))
    convention, s, got, want = where
    drawn = f"u = {s.u:.4f}" if s.u is not None else _("no u (a better or equal proposal)")
    p = min(1.0, math.exp(-float(case["beta"]) * (s.t_new - s.t_cur)))
    verdict = _("accept") if s.accepted else _("reject")
    return _(
        "the walk is not the Metropolis-Hastings chain of the grader's random stream: at "
        "iteration {iteration} the chain is at {t_cur} ms, the proposal gives "
        "operator {operator} configuration {config} ({t_new} ms), {drawn}, and "
        "min(1, exp(-beta dt)) = {p} says {verdict}: the walk should record "
        "{want} ms, yours records {got} ms. Draw i = rng.integers(len("
        "choices)), then rng.integers(choices[i]), then u = rng.random(), from the rng given, "
        "and nothing else from it"
    ).format(
        iteration=furthest + 1,
        t_cur=f"{s.t_cur * 1e3:.4f}",
        operator=s.operator,
        config=s.config,
        t_new=f"{s.t_new * 1e3:.4f}",
        drawn=drawn,
        p=f"{p:.3f}",
        verdict=verdict,
        want=f"{want * 1e3:.4f}",
        got=f"{got * 1e3:.4f}",
    )
