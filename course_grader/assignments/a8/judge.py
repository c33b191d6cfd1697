"""The judges of A8: an answer's messages and search walk against the simulator, mistakes named.

A8.1's forward halos and backward gradients are compared with the simulator's messages, pair by
pair, and a wrong one is matched with the usual mistakes (a halo for an edge worker's missing
neighbour, float64 bytes, no backward messages, gradients sent the wrong way, a padding that is
not ``k // 2``). A8.2's walk must be the Metropolis-Hastings chain that the grader's random stream drives, step
by step (:mod:`course_grader.assignments.a8.replay`: a fabricated walk fails naming the first
iteration where it departs); on the three levels a wrong rule is named by its frequencies
(exp(+beta delta), a walk that never moves); the search must return the best strategy it saw and
the exhaustive optimum on the small space. The cases are
:mod:`course_grader.assignments.a8.cases`.

Kept whole: one judge per exercise, each a list of named mistakes; most lines are their messages
(``_()`` templates and their fields, read in the student's language).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from course_grader.assignments.a8.cases import simulated_halo
from course_grader.assignments.a8.replay import first_departure
from course_lib.i18n import N_, _

__all__ = ["BYTES", "ROOM_MARGIN", "STATS_TOLERANCE", "judge_halo", "judge_room", "judge_search"]

BYTES = 4  # float32
ROOM_MARGIN = 0.10  # A8.3: the pick's step time within 10 % of the best strategy that fits
STATS_TOLERANCE = 0.04  # on each level's fraction of the walk (about 5 standard errors)
_WALK_LENGTH = N_(
    "the walk has {entries} entries for {iterations} iterations: record the "
    "current strategy's time after every iteration"
)


# -- A8.1 ------------------------------------------------------------------------------------
def _messages(got, what: str, workers: int) -> dict:
    """Return ``{(src, dst): bytes}`` from a list of (src, dst, bytes); refuse what is not."""
    shown = _(what)  # "forward" or "backward", in the current language
    if got is None or isinstance(got, (str, bytes)) or not hasattr(got, "__len__"):
        raise AssertionError(
            _("the {what} messages must be a list of (src, dst, bytes) tuples").format(what=shown)
        )
    out: dict = {}
    for m in got:
        try:
            src, dst, nbytes = (float(v) for v in np.asarray(m, dtype=float).reshape(-1))
        except (ValueError, TypeError):
            raise AssertionError(
                _(
                    "each {what} message must be a (src, dst, bytes) tuple of numbers, got {got}"
                ).format(what=shown, got=repr(m))
            ) from None
        src, dst = int(src), int(dst)
        if not (0 <= src < workers and 0 <= dst < workers):
            raise AssertionError(
                _(
                    "{what} message {src} -> {dst}: there is no worker {missing} "
                    "(workers 0..{last}); an edge worker has one neighbour only, the image's "
                    "top and bottom rows are padding, not a halo"
                ).format(
                    what=shown,
                    src=src,
                    dst=dst,
                    missing=dst if 0 <= src else src,
                    last=workers - 1,
                )
            )
        if src == dst:
            raise AssertionError(
                _("{what} message {src} -> {dst}: a worker does not send to itself").format(
                    what=shown, src=src, dst=dst
                )
            )
        if (src, dst) in out:
            raise AssertionError(
                _(
                    "two {what} messages {src} -> {dst}: send the whole halo as one message per "
                    "neighbour and pass (as the simulator does)"
                ).format(what=shown, src=src, dst=dst)
            )
        out[(src, dst)] = nbytes
    return out


def _where(case: dict) -> str:
    return _(
        "batch {batch}, {channels} x {height} x {width} input, "
        "{kernel}x{kernel} kernel, padding {padding}, "
        "stride {stride}, {workers} workers"
    ).format(**{k: case[k] for k in _CASE_FIELDS})


_CASE_FIELDS = ("batch", "channels", "height", "width", "kernel", "padding", "stride", "workers")


def _compare(got: dict, want: dict, what: str, case: dict) -> None:
    n, where, shown = case["workers"], _where(case), _(what)
    row = BYTES * case["batch"] * case["channels"] * case["width"]  # one input row, float32
    if want and not got:
        if what == "backward":
            raise AssertionError(
                _(
                    "no backward messages ({where}): the gradient of every halo row travels back "
                    "to the worker that holds the row (the same bytes, dst -> src)"
                ).format(where=where)
            )
        raise AssertionError(
            _("no forward messages ({where}), but the simulator sends {want}").format(
                where=where, want=want
            )
        )
    if (
        got
        and want
        and all(got.get(k) == 2 * v for k, v in want.items())
        and got.keys() == want.keys()
    ):
        raise AssertionError(
            _(
                "{what} bytes are twice the simulator's ({where}): float64; the kit's activations "
                "and gradients are float32, 4 bytes each"
            ).format(what=shown, where=where)
        )
    reversed_ = {(d, s): b for (s, d), b in got.items()}
    if what == "backward" and got != want and reversed_ == want:
        raise AssertionError(
            _(
                "the backward messages go the wrong way ({where}): a halo row's gradient goes "
                "back from the worker that used it to the worker that holds the row"
            ).format(where=where)
        )
    for s, d in sorted(got):
        if (s, d) not in want:
            hint = (
                _(
                    ": workers 0 and the last are not neighbours; an edge worker has a halo on "
                    "one side only"
                )
                if {s, d} == {0, n - 1} and n > 2
                else ""
            )
            raise AssertionError(
                _(
                    "{what} message {s} -> {d} ({where}), but the simulator sends none: worker "
                    "{user}'s output rows need none of worker {holder}'s input rows{hint}"
                ).format(
                    what=shown,
                    s=s,
                    d=d,
                    where=where,
                    user=d if what == "forward" else s,
                    holder=s if what == "forward" else d,
                    hint=hint,
                )
            )
    for (s, d), nbytes in sorted(want.items()):
        if (s, d) not in got:
            raise AssertionError(
                _(
                    "no {what} message {s} -> {d} ({where}): the simulator sends {nbytes} bytes "
                    "({rows} rows of batch x channels x width float32)"
                ).format(what=shown, s=s, d=d, where=where, nbytes=nbytes, rows=nbytes // row)
            )
        if got[(s, d)] != nbytes:
            k, p = case["kernel"], case["padding"]
            hint = (
                _(
                    "; with padding {p} != {half} the halo is not k // 2 rows on each side: "
                    "worker j needs input rows [o0 * stride - padding, (o1 - 1) * stride - "
                    "padding + kernel) clipped to the image, for its output rows [o0, o1)"
                ).format(p=p, half=k // 2)
                if p != k // 2 or case["stride"] > 1
                else ""
            )
            raise AssertionError(
                _(
                    "{what} message {s} -> {d} ({where}): {got} bytes, the simulator "
                    "sends {nbytes} ({rows} rows of {row} bytes){hint}"
                ).format(
                    what=shown,
                    s=s,
                    d=d,
                    where=where,
                    got=f"{got[(s, d)]:g}",
                    nbytes=nbytes,
                    rows=nbytes // row,
                    row=row,
                    hint=hint,
                )
            )


def judge_halo(answer: Callable, case: dict) -> None:
    """Judge ``answer()``'s (forward, backward) messages on one A8.1 case; raise naming the mistake."""
    got = answer()
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise AssertionError(_("halo_messages must return a tuple (forward, backward)"))
    passes = (N_("forward"), N_("backward"))  # shown as _(what) in the messages
    forward, backward = (_messages(g, w, case["workers"]) for g, w in zip(got, passes, strict=True))
    want_f, want_b = simulated_halo(**case)
    _compare(forward, want_f, "forward", case)
    _compare(backward, want_b, "backward", case)


# -- A8.2 ------------------------------------------------------------------------------------
def _judge_space(got, case: dict) -> None:
    table = np.asarray(case["table"], dtype=float)
    best, best_time, walk = got
    best = tuple(int(v) for v in np.asarray(best).reshape(-1))
    walk = np.asarray(walk, dtype=float).reshape(-1)
    if len(best) != table.ndim or any(
        not 0 <= b < n for b, n in zip(best, table.shape, strict=True)
    ):
        raise AssertionError(
            _(
                "best must be a strategy: one configuration index per operator, "
                "{ndim} indices below {shape}; got {best}"
            ).format(ndim=table.ndim, shape=table.shape, best=best)
        )
    if len(walk) != case["iterations"]:
        raise AssertionError(
            _(_WALK_LENGTH).format(entries=len(walk), iterations=case["iterations"])
        )
    values = np.unique(table)
    if not np.all(np.isin(walk, values)):
        raise AssertionError(_("the walk holds times that no strategy has: record cost(current)"))
    if not math.isclose(float(best_time), float(table[best]), rel_tol=1e-12):
        raise AssertionError(
            _("best_time {got} s is not the cost of best ({want} s)").format(
                got=f"{float(best_time):.6g}", want=f"{table[best]:.6g}"
            )
        )
    seen = min(float(table[tuple(case["start"])]), float(walk.min()))
    if float(best_time) > seen:
        raise AssertionError(
            _(
                "not keeping the best seen: the walk reached {seen} ms but best is "
                "{best} ms (the last state, not the best one, is returned?)"
            ).format(seen=f"{seen * 1e3:.4f}", best=f"{float(best_time) * 1e3:.4f}")
        )
    if float(best_time) > table.min():
        raise AssertionError(
            _(
                "after {iterations} proposals on {size} strategies the best is "
                "{best} ms, the exhaustive optimum {optimum} ms"
            ).format(
                iterations=case["iterations"],
                size=table.size,
                best=f"{float(best_time) * 1e3:.4f}",
                optimum=f"{table.min() * 1e3:.4f}",
            )
        )


def _judge_levels(got, case: dict) -> None:
    table = np.asarray(case["table"], dtype=float)
    walk = np.asarray(got[2], dtype=float).reshape(-1)
    if len(walk) != case["iterations"]:
        raise AssertionError(
            _(_WALK_LENGTH).format(entries=len(walk), iterations=case["iterations"])
        )
    level = np.abs(walk[:, None] - table[None, :]).argmin(axis=1)
    frac = np.bincount(level, minlength=len(table)) / len(walk)
    weights = np.exp(-case["beta"] * (table - table[0]))
    want = weights / weights.sum()
    shown = _("fractions of the walk at t0, t0 + d, t0 + 2d: {fractions}").format(
        fractions=np.round(frac, 3).tolist()
    )
    if np.all(np.abs(frac - want) <= STATS_TOLERANCE):
        return
    rate = f"{math.exp(-case['beta'] * (table[1] - table[0])):.2f}"
    if np.all(np.abs(frac - 1 / len(table)) <= STATS_TOLERANCE / 2):
        raise AssertionError(
            _(
                "{shown}, nearly uniform: every worse move is accepted; accepting with exp(+beta "
                "delta)? A move worse by delta > 0 is accepted with probability exp(-beta delta) "
                "(here {rate} for one level), not min(1, exp(+beta delta)) = 1"
            ).format(shown=shown, rate=rate)
        )
    if frac[0] > 1 - STATS_TOLERANCE:
        raise AssertionError(
            _(
                "{shown}: the walk never leaves the best state, so no worse move is accepted; "
                "accept a move worse by delta with probability exp(-beta delta) ({rate} here)"
            ).format(shown=shown, rate=rate)
        )
    raise AssertionError(
        _(
            "{shown}; the Boltzmann weights exp(-beta t) give {want} "
            "(+-{tolerance}): accept a move worse by delta with probability exp(-beta delta) "
            "= {rate} for one level, every better or equal move always"
        ).format(shown=shown, want=np.round(want, 3).tolist(), tolerance=STATS_TOLERANCE, rate=rate)
    )


def judge_search(answer: Callable, case: dict) -> None:
    """Judge ``answer(case)``'s (best, best_time, walk) on one A8.2 case; raise naming the mistake."""
    got = answer(case)
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        raise AssertionError(_("mh_search must return a tuple (best, best_time, walk)"))
    try:
        walk = np.asarray(got[2], dtype=float).reshape(-1)
    except (ValueError, TypeError):
        raise AssertionError(_("walk must be a list of step times (numbers)")) from None
    departure = first_departure(walk, case)  # the chain itself, replayed from the grader's seed
    if case["what"] == "levels":
        _judge_levels(got, case)  # a wrong rule shows in the frequencies: name it by them
    if departure:
        raise AssertionError(departure)
    if case["what"] in ("space", "hot"):
        _judge_space(got, case)


# -- A8.3 ------------------------------------------------------------------------------------
def judge_room(answer: Callable, case: dict) -> None:
    """Judge ``answer(case)``'s pick in one A8.3 room: it fits the memory, within the margin."""
    times = np.asarray(case["times"], dtype=float)
    peaks = np.asarray(case["peaks"], dtype=float)
    try:
        pick = tuple(int(v) for v in np.asarray(answer(case)).reshape(-1))
    except (ValueError, TypeError):
        raise AssertionError(
            _("choose_strategy must return a strategy: a tuple of indices")
        ) from None
    if len(pick) != times.ndim or any(
        not 0 <= b < n for b, n in zip(pick, times.shape, strict=True)
    ):
        raise AssertionError(
            _(
                "the pick must be one configuration index per operator, {ndim} indices below "
                "{shape}; got {pick}"
            ).format(ndim=times.ndim, shape=times.shape, pick=pick)
        )
    room = _("batch {batch}, a {rate} MB/s link, {workers} PCs of {memory} kB").format(
        batch=case["batch"],
        rate=f"{case['bytes_per_s'] / 1e6:g}",
        workers=case["workers"],
        memory=f"{case['memory'] / 1e3:.1f}",
    )
    need = float(peaks[pick])
    if need > case["memory"]:
        raise AssertionError(
            _(
                "the pick does not fit ({room}): it needs {need} kB per PC (weights, "
                "gradients, Adam's two moments and the activations), more than the room has; a "
                "strategy that does not fit cannot run, however fast it is predicted to be"
            ).format(room=room, need=f"{need / 1e3:.1f}")
        )
    best = float(times[peaks <= case["memory"]].min())
    t = float(times[pick])
    if t > (1 + ROOM_MARGIN) * best:
        raise AssertionError(
            _(
                "the pick fits but is far slower than the best ({room}): {t} ms a step, "
                "{slower} slower than the fastest strategy that fits "
                "({best} ms); within {margin} is asked: search further within "
                "the budget"
            ).format(
                room=room,
                t=f"{t * 1e3:.4f}",
                slower=f"{t / best - 1:.0%}",
                best=f"{best * 1e3:.4f}",
                margin=f"{ROOM_MARGIN:.0%}",
            )
        )
