"""Checks for the exercises of lecture 6 (topologies: gossip, mixing matrices, spectral gap).

Exercise 6.1 compares the student's mixing matrix of one gossip step with the library's for
every world size 2..9 and every partner distance (the shared partner of P = 2 and s = P/2
included). Exercise 6.2 compares the student's spectral gap with ``1 - ||W - J||_2`` on
symmetric and non-symmetric doubly stochastic matrices. While the student's function runs, the
library's ``gossip_matrix`` and ``spectral_gap`` (and ``contraction``) refuse to
(:func:`course_lib.checks.verdict.refusing`): the lecture imports them to teach from them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from course_lib.checks.verdict import Verdict, refusing, run_check
from course_lib.collectives.mixing import (
    allreduce_matrix,
    gossip_distances,
    gossip_matrix,
    rotation_product,
    spectral_gap,
)
from course_lib.i18n import N_, _

__all__ = [
    "REFUSED",
    "check_gossip_matrix",
    "check_spectral_gap",
    "eigenvalue_gap",
    "wrong_gossip_matrix",
]

_MIXING = "course_lib.collectives.mixing"
REFUSED = {  # exercise -> the library functions that answer it, and what to write instead
    "6.1": {
        f"{_MIXING}.gossip_matrix": N_(
            "add 1/3 for self and for each partner gossip_partners gives"
        )
    },
    "6.2": {
        f"{_MIXING}.spectral_gap": N_("compute 1 - the largest singular value of W - J with NumPy"),
        f"{_MIXING}.contraction": N_("compute 1 - the largest singular value of W - J with NumPy"),
    },
}


# ---- Exercise 6.1: the mixing matrix of one gossip step -----------------------------------------
def wrong_gossip_matrix(world_size: int, s: int) -> np.ndarray:
    """A tempting mistake: assignments instead of additions, so a shared partner gets only 1/3."""
    w = np.zeros((world_size, world_size))
    for i in range(world_size):
        w[i, i] = w[i, (i - s) % world_size] = w[i, (i + s) % world_size] = 1 / 3
    return w


def _gossip_matrix_body(fn: Callable) -> str:
    cases = [(p, s) for p in range(2, 10) for s in sorted(set(gossip_distances(p, p)))]
    for p, s in cases:
        with refusing(REFUSED["6.1"], fn):
            got = np.asarray(fn(p, s), dtype=float)
        want = gossip_matrix(p, s)
        if got.shape != want.shape:
            raise AssertionError(
                _("P={p}, s={s}: got a {shape} matrix, want ({p}, {p})").format(
                    p=p, s=s, shape=got.shape
                )
            )
        if not np.allclose(got, want, atol=1e-12):
            i, j = np.unravel_index(np.argmax(np.abs(got - want)), want.shape)
            hint = (
                _(
                    " (when the left and right partner are the same rank, its message counts "
                    "twice: add, do not assign)"
                )
                if (p == 2 or 2 * s == p)
                else ""
            )
            raise AssertionError(
                _("P={p}, s={s}: entry [{i}, {j}] is {got}, want {want}{hint}").format(
                    p=p, s=s, i=i, j=j, got=f"{got[i, j]:.4f}", want=f"{want[i, j]:.4f}", hint=hint
                )
            )
    return _("{n} (P, s) pairs, P = 2..9, every entry equal to one gossip step's weight").format(
        n=len(cases)
    )


def check_gossip_matrix(fn: Callable, *, verbose: bool = True) -> Verdict:
    """Exercise 6.1: ``fn(world_size, s)`` against the library's gossip matrix."""
    return run_check(
        "6.1", "gossip mixing matrix", lambda: _gossip_matrix_body(fn), verbose=verbose
    )


# ---- Exercise 6.2: the spectral gap -------------------------------------------------------------
def eigenvalue_gap(w: np.ndarray) -> float:
    """A tempting shortcut: 1 - the second-largest |eigenvalue|; wrong for non-symmetric W."""
    values = np.sort(np.abs(np.linalg.eigvals(w)))
    return float(1 - values[-2])


def _cases() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(6)
    perms = [np.eye(5)[rng.permutation(5)] for _perm in range(3)]
    skewed = 0.5 * perms[0] + 0.3 * perms[1] + 0.2 * perms[2]  # doubly stochastic, not symmetric
    return [
        (N_("allreduce, P=4"), allreduce_matrix(4)),
        (N_("ring, P=6"), gossip_matrix(6, 1)),
        (N_("rotation, P=8"), rotation_product(8)),
        (N_("two ranks"), gossip_matrix(2, 1)),
        (N_("identity, P=3"), np.eye(3)),
        (N_("non-symmetric, P=5"), skewed),
    ]


def _spectral_gap_body(fn: Callable) -> str:
    for name, w in _cases():
        with refusing(REFUSED["6.2"], fn):
            got = float(fn(w.copy()))
        want = spectral_gap(w)
        if not np.isclose(got, want, atol=1e-9):
            raise AssertionError(
                _(
                    "{name}: got {got}, want {want} = 1 - ||W - J||_2 (J: every entry 1/P; "
                    "use the largest singular value, which bounds one step even when W is not "
                    "symmetric)"
                ).format(name=_(name), got=f"{got:.4f}", want=f"{want:.4f}")
            )
    return _("{n} matrices, allreduce gap 1, identity gap 0").format(n=len(_cases()))


def check_spectral_gap(fn: Callable, *, verbose: bool = True) -> Verdict:
    """Exercise 6.2: ``fn(W)`` against ``1 - ||W - J||_2``."""
    return run_check("6.2", "spectral gap", lambda: _spectral_gap_body(fn), verbose=verbose)
