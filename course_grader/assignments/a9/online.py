"""A9.1's judge: one block of the online softmax, against the softmax over every block so far.

A case is a running state built by the judge from earlier score blocks *directly* (not by an
update): per query row the maximum ``m`` of its scores so far, ``ell`` = the sum of
$e^{s - m}$ and ``acc`` = the sum of $e^{s - m} v$ (FlashAttention's unnormalised output,
Dao et al. 2022; Milakov & Gimelshein 2018), and a new block of scores ``s`` with its values
``v``. The answer's new state must be that of the softmax over the prefix and the block
together, computed in one go in float64: so ``acc / ell`` is full softmax attention over every
key seen. The cases make the new block raise the running maximum (by 6 units: without the
rescale by $e^{m - m'}$ the old sums weigh $e^6$ too much), lower it, start from nothing
(``m`` = -inf) and hold masked (-inf) scores. A wrong state is compared with the usual mistakes
and the verdict names the match.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from course_lib.i18n import N_, _

__all__ = ["ONLINE_CASES", "judge_update", "online_cases"]

#: (what the case is, leading shape, rows, prefix keys, block keys, width, shift of the block)
ONLINE_CASES = (
    (N_("the first block (m = -inf)"), (), 5, 0, 6, 3, 0.0),
    (N_("a block that raises the running maximum"), (2,), 4, 5, 7, 3, 6.0),
    (N_("a block below the running maximum"), (), 6, 8, 4, 2, -4.0),
    (N_("a diagonal block, masked above its diagonal"), (2,), 5, 3, 5, 4, 2.0),
)


def _state(s: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The running state of the softmax over the keys of ``s``, computed in one go (float64)."""
    lead = s.shape[:-1]
    if s.shape[-1] == 0:
        return np.full(lead, -np.inf), np.zeros(lead), np.zeros((*lead, v.shape[-1]))
    m = s.max(-1)
    e = np.exp(s - m[..., None])
    return m, e.sum(-1), e @ v


def online_cases(seed: int | None = None) -> list[dict]:
    """The cases on ``seed`` (None: the notebook's own): arrays of float32 only."""
    rng = np.random.default_rng(91 if seed is None else (int(seed) * 1_000_003 + 91) % 2**40)
    cases = []
    for _what, lead, rows, before, keys, d, shift in ONLINE_CASES:
        s0 = rng.normal(0, 2, (*lead, rows, before)).astype(np.float32)
        v0 = rng.normal(0, 1, (*lead, before, d)).astype(np.float32)
        s = (rng.normal(0, 2, (*lead, rows, keys)) + shift).astype(np.float32)
        if keys == rows:  # a diagonal block: key j after query i is masked
            s = np.where(np.triu(np.ones((rows, keys), bool), 1), np.float32(-np.inf), s)
        v = rng.normal(0, 1, (*lead, keys, d)).astype(np.float32)
        m, ell, acc = (x.astype(np.float32) for x in _state(s0.astype(float), v0.astype(float)))
        cases.append({"m": m, "ell": ell, "acc": acc, "s": s, "v": v, "s0": s0, "v0": v0})
    return cases


def _close(got: Any, want: np.ndarray, rtol: float = 1e-5) -> bool:
    if not isinstance(got, np.ndarray) or got.shape != want.shape or got.dtype.kind != "f":
        return False
    if not np.all(np.isfinite(got)):
        return False
    return bool(np.abs(got - want).max(initial=0.0) <= rtol * max(np.abs(want).max(), 1.0))


def _variants(case: dict) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The new state the usual mistakes give, in float64 (every entry finite where they are)."""
    m, ell, acc = (case[k].astype(float) for k in ("m", "ell", "acc"))
    s, v = case["s"].astype(float), case["v"].astype(float)
    with np.errstate(all="ignore"):
        m_new = np.maximum(m, s.max(-1))
        e = np.exp(s - m_new[..., None])
        rescale = np.exp(m - m_new)
        own = s.max(-1)  # the block's maximum alone
        block, to_own = np.exp(s - own[..., None]), np.exp(m - own)
        return {
            "no_rescale": (m_new, ell + e.sum(-1), acc + e @ v),
            "inverted": (m_new, ell / rescale + e.sum(-1), acc / rescale[..., None] + e @ v),
            "ell_only": (m_new, ell * rescale + e.sum(-1), acc + e @ v),
            "acc_only": (m_new, ell + e.sum(-1), acc * rescale[..., None] + e @ v),
            "block_max": (own, ell * to_own + block.sum(-1), acc * to_own[..., None] + block @ v),
        }


_MISTAKES = {
    "no_rescale": N_(
        "softmax without rescaling by the running max: ell and acc were summed "
        "relative to the old maximum m, and the block's terms relative to the new one m'; "
        "multiply the old ell and acc by exp(m - m') before adding the block's"
    ),
    "inverted": N_(
        "the rescale is inverted: the old sums were taken relative to m, so going to "
        "m' >= m shrinks them by exp(m - m'), not exp(m' - m)"
    ),
    "ell_only": N_(
        "ell was rescaled by exp(m - m') but acc was not: both sums were taken "
        "relative to the old maximum"
    ),
    "acc_only": N_(
        "acc was rescaled by exp(m - m') but ell was not: both sums were taken "
        "relative to the old maximum"
    ),
    "block_max": N_(
        "m' is the block's own maximum, not the running one, max(m, the block's): "
        "below the old maximum, exp(m - m') exceeds 1 and the sums can overflow"
    ),
}


def judge_update(index: int, case: dict, got: Any) -> str:
    """Return "" or what is wrong with the answer's new state for case ``index``."""
    what = _(ONLINE_CASES[index][0])
    head = _("case {number} ({what}, scores of shape {shape})").format(
        number=index + 1, what=what, shape=case["s"].shape
    )
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return _("{head}: return the new state as a tuple (m, ell, acc)").format(head=head)
    s_all = np.concatenate([case["s0"], case["s"]], -1).astype(float)
    v_all = np.concatenate([case["v0"], case["v"]], -2).astype(float)
    want = _state(s_all, v_all)
    names = ("m", "ell", "acc")
    for name, g, w in zip(names, got, want, strict=True):
        if not isinstance(g, np.ndarray) or g.shape != w.shape:
            shape = getattr(g, "shape", type(g).__name__)
            return _("{head}: {name} has shape {shape}, not {want}").format(
                head=head, name=name, shape=shape, want=w.shape
            )
    if all(_close(g, w) for g, w in zip(got, want, strict=True)):
        return ""
    if _close(got[2], want[2] / want[1][..., None]) and _close(got[0], want[0]):
        return _(
            "{head}: acc is normalised (acc / ell): keep the unnormalised sum of exp(s - m) v, "
            "and divide by ell once, after the last block"
        ).format(head=head)
    if _close(got[0], case["m"].astype(float)) and not _close(want[0], case["m"].astype(float)):
        return _(
            "{head}: m was not updated: the running maximum is max(m, the block's maximum)"
        ).format(head=head)
    if not all(np.all(np.isfinite(g)) for g in got):
        return _(
            "{head}: the new state holds nan or inf; with nothing seen yet (m = -inf) the "
            "rescale exp(m - m') is 0, not exp(m' - m) (inf), and a masked score (-inf) adds 0"
        ).format(head=head)
    for name, variant in _variants(case).items():
        if all(_close(g, w) for g, w in zip(got, variant, strict=True)):
            return f"{head}: {_(_MISTAKES[name])}"
    wrong = [n for n, g, w in zip(names, got, want, strict=True) if not _close(g, w)]
    return _(
        "{head}: {names} differ from the softmax over every key so far (the "
        "prefix's and this block's together)"
    ).format(head=head, names=", ".join(wrong))
