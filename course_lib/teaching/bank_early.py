"""Lectures 0-3: the questions at the end of each lecture; numeric answers computed by the lecture's own formulas."""

from __future__ import annotations

import math

import numpy as np

from course_lib.comm import GIGABIT
from course_lib.comm.buffers import chunk_bounds
from course_lib.cost_model.alpha_beta import LinkModel, predict
from course_lib.i18n import _
from course_lib.teaching.questions import Numeric, Question, choice
from course_lib.training.scratch import corr2d, max_pool2d

__all__ = ["EARLY", "GIGABIT_MODEL", "UNET_BYTES"]

GIGABIT_MODEL = LinkModel.from_link(GIGABIT)
UNET_BYTES = 8.33e6  # bytes: the U-Net gradient of Krivosheev et al. (source 000), float32


def _lecture0() -> list[Question]:
    sizes = [b - a for a, b in chunk_bounds(10, 4)]
    # Lecture 0's texts in the notebook's language (course_lib.i18n); the answers do not change.
    return [
        Numeric("0.q1", _("Four engines hold x = rank + 1. After an allreduce with op = sum, what "
                "does engine 2 hold?"), float(sum(r + 1 for r in range(4))),
                _("an allreduce leaves the same total, 1 + 2 + 3 + 4, on every rank"), rel_tol=1e-9),
        Numeric("0.q2", _("A buffer of 10 values is scattered over 4 engines in the kit's chunks "
                "(`chunk_bounds`). How many values does engine 0 get?"), float(sizes[0]),
                _("chunks of {sizes}: the first 10 mod 4 engines get one more").format(sizes=sizes),
                rel_tol=1e-9),
        choice("0.q3", _("Ranks 0-2 call `allreduce`; rank 3 never does. What happens without "
               "the kit's timeouts?"), (_("a hang: the three wait for ever"), _("a deadlock between "
               "all four"), _("rank 3's value is taken as zero")), 0,
               _("a rank that never joins is a hang; a deadlock is a cycle of waits")),
        choice("0.q4", _("Every rank sends a large array to its right neighbour, then receives "
               "from its left, with blocking calls. What happens?"), (_("it works, only slowly"),
               _("a deadlock: each send waits for a receive nobody has posted"),
               _("MPI reorders the calls")), 1,
               _("rendezvous sends wait for the receiver; all wait in a cycle")),
        choice("0.q5", _("What does `%%px` run the cell on?"), (_("every engine of the view"),
               _("engine 0 only"), _("the notebook's own kernel")), 0, _("%px is parallel execute")),
    ]  # fmt: skip


def _lecture1() -> list[Question]:
    L, eta = 2.0, 0.75
    return [
        Numeric("1.q1", "Gradient descent on f(w) = L/2 w² with L = 4: the largest stable "
                "learning rate?", 2 / 4.0, "stable while eta < 2 / L"),
        Numeric("1.q2", f"Gradient descent on f(w) = L/2 w² with L = {L:g} and eta = {eta:g}, "
                "from w = 1: |w| after three steps?", abs((1 - eta * L) ** 3),
                "each step multiplies w by 1 - eta L"),
        Numeric("1.q3", "A mini-batch gradient's variance is 0.8 at B = 16. What is it at "
                "B = 64?", 0.8 * 16 / 64, "the variance of a mean of B samples falls as 1 / B"),
        Numeric("1.q4", "1437 training digits, mini-batches of 64 (the last one smaller): "
                "updates per epoch?", float(math.ceil(1437 / 64)), "ceil(n / B) steps",
                rel_tol=1e-9),
        choice("1.q5", "Doubling the batch at the same learning rate halves ...",
               ("the gradient noise's variance", "the loss", "the time per epoch on one core"),
               0, "noise ∝ 1/B; the work per epoch stays the same"),
    ]  # fmt: skip


def _lecture2() -> list[Question]:
    out = corr2d(np.zeros((28, 28)), np.zeros((5, 5))).shape[0]
    pooled = max_pool2d(np.zeros((1, 1, 24, 24))).shape[-1]
    return [
        Numeric("2.q1", "A 28×28 image, a 5×5 kernel, no padding, stride 1: the output's "
                "height?", float(out), "(H + 2p - k) / s + 1", rel_tol=1e-9),
        Numeric("2.q2", "2×2 max pooling with stride 2 on a 24×24 map: the output's height?",
                float(pooled), "each window of 2×2 becomes one value", rel_tol=1e-9),
        Numeric("2.q3", "A convolution from 3 to 16 channels with 3×3 kernels and a bias: "
                "how many parameters?", float(16 * 3 * 3 * 3 + 16),
                "out × in × k × k weights plus one bias per output channel", rel_tol=1e-9),
        Numeric("2.q4", "Two 3×3 convolutions (stride 1) in a row: the receptive field's "
                "width in input pixels?", 5.0, "each adds k - 1 = 2", rel_tol=1e-9),
        choice("2.q5", "Why does a convolution need far fewer weights than a dense layer on "
               "the same image?", ("the same small kernel is shared by every position",
               "it uses float16", "it skips the borders"), 0, "weight sharing and locality"),
    ]  # fmt: skip


def _lecture3() -> list[Question]:
    ring_mb = 2 * 3 / 4 * UNET_BYTES / 1e6
    return [
        Numeric("3.q1", "A ring allreduce of the 8.33 MB U-Net gradient on N = 4 ranks: MB "
                "each rank sends?", ring_mb, "2 (N - 1) / N × n", unit="MB"),
        Numeric("3.q2", "One 1 MB message over the emulated Gigabit link (alpha = 50 µs, "
                "1/beta = 125 MB/s): the alpha-beta time in ms?",
                1e3 * predict("p2p", 1e6, 2, GIGABIT_MODEL), "alpha + n beta", unit="ms"),
        Numeric("3.q3", "The ring allreduce of 8.33 MB on 4 ranks over that link: predicted "
                "ms?", 1e3 * predict("ring_allreduce", UNET_BYTES, 4, GIGABIT_MODEL),
                "2 (N - 1) (alpha + n / N beta)", unit="ms"),
        Numeric("3.q4", "How many steps does a ring allreduce take on N = 4 ranks?", 6.0,
                "N - 1 reduce-scatter steps and N - 1 allgather steps", rel_tol=1e-9),
        choice("3.q5", "For a 1 kB buffer on a high-latency link, which allreduce wins?",
               ("recursive doubling: log2 N latency terms", "the ring: fewer bytes",
                "the star: one hop"), 0, "small messages pay alpha, not n beta"),
    ]  # fmt: skip


EARLY: dict[int, list[Question]] = {
    0: _lecture0(),
    1: _lecture1(),
    2: _lecture2(),
    3: _lecture3(),
}
