"""Checks of assignment A1 (label smoothing, SGD with momentum, a convolution's backward pass).

Each check compares the student's NumPy code with torch (``F.cross_entropy`` with
``label_smoothing``, ``torch.optim.SGD``, autograd through ``F.conv2d``) on fixed seeds, so its
verdict line is the same on every run. The grader runs these same checks in its own process
(:mod:`course_grader.assignments.a1.probe`): the sandboxed kernel only calls the answer on the inputs
below (``*_inputs(seed)``, the grader picks the seed) and returns the results as data. The
library's ``training/scratch.py`` (plain cross-entropy, plain SGD, convolution forward only)
answers none of them: lecture 2 builds the convolution's forward, and torch computed its
gradients; A1.3 asks for the backward pass (dX, dK, db), which the course never shows.

Kept whole: three exercises, each a short section of inputs, torch reference and check.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from course_lib.checks.verdict import Verdict, assert_close, run_check
from course_lib.i18n import N_, _

__all__ = [
    "check_smoothed_cross_entropy",
    "check_sgd_momentum",
    "check_conv2d_backward",
    "conv2d_backward_inputs",
    "sgd_inputs",
    "smoothed_cross_entropy_inputs",
    "torch_loss_and_grad",
    "A1_POINTS",
]

A1_POINTS = {"A1.1": 2.0, "A1.2": 3.0, "A1.3": 3.0}
SMOOTHING = 0.1  # the label smoothing of the loss A1.2's check trains on


def _problem(rng: np.random.Generator, n: int, d: int, k: int):
    return (
        rng.normal(size=(d, k)),
        rng.normal(size=k),
        rng.normal(size=(n, d)),
        rng.integers(0, k, n),
    )


def _torch_loss(W, b, X, y, eps: float) -> torch.Tensor:
    return F.cross_entropy(torch.as_tensor(X) @ W + b, torch.as_tensor(y), label_smoothing=eps)


def torch_loss_and_grad(W, b, X, y, eps: float = SMOOTHING):
    """Return (loss, dW, db) of the mean label-smoothed cross-entropy, by torch autograd."""
    Wt = torch.tensor(W, requires_grad=True)
    bt = torch.tensor(b, requires_grad=True)
    loss = _torch_loss(Wt, bt, X, y, eps)
    loss.backward()
    return loss.item(), Wt.grad.numpy(), bt.grad.numpy()


def smoothed_cross_entropy_inputs(seed: int = 0) -> list[dict]:
    """A1.1's cases: {W, b, X, y, eps}; ``seed`` 0 is the notebook's, the grader picks another."""
    rng = np.random.default_rng(101 + seed)
    # (n, d, k, eps, logit scale): eps / (k - 1) differs from torch's eps / k for any k;
    # eps = 0 is lecture 1's loss; logits in the hundreds make log(softmax) underflow.
    shapes = [
        (1, 3, 2, 0.1, 1.0),
        (8, 5, 4, 0.2, 1.0),
        (64, 20, 10, 0.1, 1.0),
        (16, 6, 5, 0.0, 1.0),
        (8, 4, 3, 0.3, 400.0),
    ]
    cases = []
    for n, d, k, eps, scale in shapes:
        W, b, X, y = _problem(rng, n, d, k)
        cases.append({"W": W, "b": b, "X": X * scale, "y": y, "eps": eps})
    return cases


def check_smoothed_cross_entropy(
    smoothed_cross_entropy: Callable, *, verbose: bool = True, seed: int = 0
) -> Verdict:
    """A1.1: ``smoothed_cross_entropy(W, b, X, y, eps) -> (loss, dW, db)`` against torch."""

    def body() -> str:
        cases = smoothed_cross_entropy_inputs(seed)
        for case in cases:
            W, b, X, y, eps = (case[key] for key in ("W", "b", "X", "y", "eps"))
            n, k = len(y), W.shape[1]
            got = smoothed_cross_entropy(W.copy(), b.copy(), X.copy(), y.copy(), eps)
            if not isinstance(got, tuple) or len(got) != 3:
                raise AssertionError(_("smoothed_cross_entropy must return a tuple (loss, dW, db)"))
            loss, dW, db = got
            want_loss, want_dW, want_db = torch_loss_and_grad(W, b, X, y, eps)
            where = _("batch {n}, {k} classes, eps {eps}").format(n=n, k=k, eps=eps)
            if not np.all(np.isfinite(np.asarray(loss, dtype=float))):
                raise AssertionError(
                    _(
                        "loss is {loss} ({where}, logits up to {top}): log(softmax(Z)) "
                        "underflows; compute log p as Z - logsumexp(Z)"
                    ).format(loss=loss, where=where, top=f"{np.abs(X @ W + b).max():.0f}")
                )
            assert_close(
                _("loss ({where})").format(where=where),
                np.asarray(loss, dtype=float),
                np.array(want_loss),
            )
            assert_close(f"dW ({where})", dW, want_dW)
            assert_close(f"db ({where})", db, want_db)
        return _(
            "loss and gradient equal to torch's label-smoothed cross-entropy in {n} cases, "
            "large logits included"
        ).format(n=len(cases))

    name = "smoothed_cross_entropy"
    return run_check("A1.1", name, body, max_points=A1_POINTS["A1.1"], verbose=verbose)


def _torch_sgd_momentum(W, b, X, y, lr_at, momentum, weight_decay, batch_size, num_epochs, seed):
    """Return (W, b) after torch.optim.SGD's run: decay on W only, lr_at(t) at global step t."""
    Wt = torch.tensor(W, requires_grad=True)
    bt = torch.tensor(b, requires_grad=True)
    groups = [{"params": [Wt], "weight_decay": weight_decay}, {"params": [bt], "weight_decay": 0.0}]
    opt = torch.optim.SGD(groups, lr=lr_at(0), momentum=momentum)
    rng, t = np.random.default_rng(seed), 0
    for _epoch in range(num_epochs):
        order = rng.permutation(len(X))
        for start in range(0, len(X), batch_size):
            idx = order[start : start + batch_size]
            for group in opt.param_groups:
                group["lr"] = lr_at(t)
            opt.zero_grad()
            _torch_loss(Wt, bt, X[idx], y[idx], SMOOTHING).backward()
            opt.step()
            t += 1
    return Wt.detach().numpy(), bt.detach().numpy()


def _warmup_then_step(t: int) -> float:
    """The schedule of A1.2's last case: linear warm-up over 4 steps, then halve every 6 steps."""
    return 0.2 * min(1.0, (t + 1) / 4) * 0.5 ** (t // 6)


def _constant(t: int) -> float:
    return 0.1


SCHEDULES = {"constant": _constant, "warmup_then_step": _warmup_then_step}


def sgd_inputs(seed: int = 0) -> list[dict]:
    """A1.2's runs: {what, W, b, X, y, schedule, momentum, weight_decay, batch_size,
    num_epochs, order_seed}; ``seed`` 0 is the notebook's."""
    # Each run adds one feature to the one before, so the first failure names what is missing.
    runs = [
        (N_("plain mini-batch SGD"), 10, 4, 1, 0.0, 0.0, "constant"),
        (N_("momentum 0.9 over 2 epochs"), 10, 3, 2, 0.9, 0.0, "constant"),
        (N_("weight decay 0.05 on W"), 37, 8, 3, 0.9, 0.05, "constant"),
        (N_("warm-up then step decay"), 20, 6, 4, 0.5, 0.1, "warmup_then_step"),
    ]
    cases = []
    for what, n, batch_size, num_epochs, momentum, weight_decay, schedule in runs:
        W, b, X, y = _problem(np.random.default_rng(n + seed), n, 6, 3)
        cases.append(
            {
                "what": what,
                "W": W,
                "b": b,
                "X": X,
                "y": y,
                "schedule": schedule,
                "momentum": momentum,
                "weight_decay": weight_decay,
                "batch_size": batch_size,
                "num_epochs": num_epochs,
                "order_seed": 7 + seed,
            }
        )
    return cases


def check_sgd_momentum(sgd_momentum: Callable, *, verbose: bool = True, seed: int = 0) -> Verdict:
    """A1.2: ``sgd_momentum(loss_and_grad, W, b, X, y, lr_at, momentum, weight_decay,
    batch_size, num_epochs, rng) -> (W, b)`` against ``torch.optim.SGD``.

    The check passes torch's loss and gradient, so a wrong A1.1 does not cost A1.2's points.
    """

    def body() -> str:
        cases = sgd_inputs(seed)
        for case in cases:
            W, b, X, y = case["W"], case["b"], case["X"], case["y"]
            what, lr_at = _(case["what"]), SCHEDULES[case["schedule"]]
            momentum, weight_decay = case["momentum"], case["weight_decay"]
            batch_size, num_epochs = case["batch_size"], case["num_epochs"]
            got = sgd_momentum(
                torch_loss_and_grad,
                W.copy(),
                b.copy(),
                X,
                y,
                lr_at,
                momentum,
                weight_decay,
                batch_size,
                num_epochs,
                np.random.default_rng(case["order_seed"]),
            )
            if not isinstance(got, tuple) or len(got) != 2:
                raise AssertionError(_("sgd_momentum must return a tuple (W, b)"))
            want_W, want_b = _torch_sgd_momentum(
                W,
                b,
                X,
                y,
                lr_at,
                momentum,
                weight_decay,
                batch_size,
                num_epochs,
                case["order_seed"],
            )
            assert_close(f"W ({what})", got[0], want_W)
            assert_close(f"b ({what})", got[1], want_b)
        return _(
            "equal to torch.optim.SGD in {n} runs: momentum, weight decay on W, "
            "a learning-rate schedule, a short last batch"
        ).format(n=len(cases))

    return run_check("A1.2", "sgd_momentum", body, max_points=A1_POINTS["A1.2"], verbose=verbose)


def conv2d_backward_inputs(seed: int = 0) -> list[dict]:
    """A1.3's cases: {X, K, dY, stride, padding}; ``seed`` 0 is the notebook's."""
    rng = np.random.default_rng(303 + seed)
    # (c_in, c_out, h, w, kh, kw, stride, padding), in the order that names the usual mistakes:
    # windows that tile the image; overlapping windows (dX must add their shares); padding (dX
    # drops it, dK sees it); stride 2 with pixels no window reaches; all at once, non-square.
    shapes = [
        (1, 1, 6, 6, 2, 2, 2, 0),
        (1, 1, 5, 5, 3, 3, 1, 0),
        (2, 3, 6, 5, 3, 2, 1, 1),
        (2, 2, 8, 7, 3, 1, 2, 0),
        (3, 2, 9, 10, 4, 2, 3, 1),
    ]
    cases = []
    for c_in, c_out, h, w, kh, kw, stride, padding in shapes:
        h_out = (h + 2 * padding - kh) // stride + 1
        w_out = (w + 2 * padding - kw) // stride + 1
        cases.append(
            {
                "X": rng.normal(size=(c_in, h, w)),
                "K": rng.normal(size=(c_out, c_in, kh, kw)),
                "dY": rng.normal(size=(c_out, h_out, w_out)),
                "stride": stride,
                "padding": padding,
            }
        )
    return cases


def _torch_conv2d_backward(X, K, dY, stride: int, padding: int) -> tuple:
    """Return torch autograd's (dX, dK, db) of ``conv2d(X, K, b, stride, padding)`` for ``dY``."""
    Xt, Kt = torch.tensor(X, requires_grad=True), torch.tensor(K, requires_grad=True)
    bt = torch.zeros(K.shape[0], dtype=torch.float64, requires_grad=True)
    F.conv2d(Xt[None], Kt, bt, stride, padding).backward(torch.tensor(dY)[None])
    return Xt.grad.numpy(), Kt.grad.numpy(), bt.grad.numpy()


def _windows_per_pixel(X, K, stride: int, padding: int) -> np.ndarray:
    """Return how many of the forward's windows read each pixel of ``X`` (0 outside them all)."""
    _, h, w = X.shape
    kh, kw = K.shape[2:]
    count = np.zeros((h + 2 * padding, w + 2 * padding), dtype=int)
    for i in range(0, h + 2 * padding - kh + 1, stride):
        for j in range(0, w + 2 * padding - kw + 1, stride):
            count[i : i + kh, j : j + kw] += 1
    return count[padding : padding + h, padding : padding + w]


def _judge_dX(where: str, got, want, X, K, stride: int, padding: int) -> None:
    """Raise AssertionError naming dX's mistake: the padding kept, overlaps overwritten."""
    got = np.asarray(got)
    padded = (X.shape[0], X.shape[1] + 2 * padding, X.shape[2] + 2 * padding)
    if padding and got.shape == padded:
        raise AssertionError(
            _(
                "dX ({where}) has the padded shape {got}: the padding is not an input, cut "
                "it off to X's shape {want}"
            ).format(where=where, got=got.shape, want=want.shape)
        )
    if got.shape == want.shape and got.dtype.kind in "fiu":
        wrong = ~np.isclose(got, want, rtol=1e-6, atol=1e-8)
        shared = np.broadcast_to(_windows_per_pixel(X, K, stride, padding) > 1, want.shape)
        if wrong.any() and shared[wrong].all():
            raise AssertionError(
                _(
                    "dX ({where}) is right where one window reads a pixel and wrong where "
                    "windows overlap: a pixel read by several windows gets the sum of their "
                    "gradients (add with +=, do not overwrite)"
                ).format(where=where)
            )
    assert_close(f"dX ({where})", got, want)


def _judge_dK(where: str, got, want, X, dY, stride: int, padding: int) -> None:
    """Raise AssertionError naming dK's mistake: a flipped kernel, one window's share only."""
    if got.shape == want.shape and np.allclose(got, want[..., ::-1, ::-1]):
        raise AssertionError(
            _(
                "dK ({where}) is flipped: the forward is a cross-correlation (the kernel is not "
                "flipped), so neither is its gradient"
            ).format(where=where)
        )
    kh, kw = want.shape[2:]
    i, j = (dY.shape[1] - 1) * stride, (dY.shape[2] - 1) * stride
    window = np.pad(X, ((0, 0), (padding, padding), (padding, padding)))[:, i : i + kh, j : j + kw]
    if got.shape == want.shape and np.allclose(got, dY[:, -1, -1, None, None, None] * window):
        raise AssertionError(
            _(
                "dK ({where}) holds the last window's share only: every output position adds "
                "dY[o, i, j] times its window (+=)"
            ).format(where=where)
        )
    assert_close(f"dK ({where})", got, want)


def check_conv2d_backward(
    conv2d_backward: Callable, *, verbose: bool = True, seed: int = 0
) -> Verdict:
    """A1.3: ``conv2d_backward(X, K, dY, stride, padding) -> (dX, dK, db)`` against torch autograd."""

    def body() -> str:
        cases = conv2d_backward_inputs(seed)
        for case in cases:
            X, K, dY = case["X"], case["K"], case["dY"]
            stride, padding = case["stride"], case["padding"]
            kh, kw = K.shape[2:]
            where = _("{kh}x{kw} kernel, stride {stride}, padding {padding}").format(
                kh=kh, kw=kw, stride=stride, padding=padding
            )
            want_dX, want_dK, want_db = _torch_conv2d_backward(X, K, dY, stride, padding)
            try:
                got = conv2d_backward(X.copy(), K.copy(), dY.copy(), stride, padding)
            except (ValueError, IndexError) as exc:  # e.g. a window sliced past the padding
                raise AssertionError(f"{where}: {type(exc).__name__}: {exc}") from None
            if not isinstance(got, tuple) or len(got) != 3:
                raise AssertionError(_("conv2d_backward must return a tuple (dX, dK, db)"))
            dX, dK, db = got
            _judge_dX(where, dX, want_dX, X, K, stride, padding)
            dK = np.asarray(dK)
            _judge_dK(where, dK, want_dK, X, dY, stride, padding)
            db = np.asarray(db)
            if db.shape == want_db.shape and np.allclose(db * dY[0].size, want_db):
                raise AssertionError(
                    _(
                        "db ({where}) is the mean of dY over the output positions: the bias is "
                        "added at every position, so its gradient is their sum"
                    ).format(where=where)
                )
            assert_close(f"db ({where})", db, want_db)
        return _(
            "dX, dK and db equal to torch's autograd of conv2d in {n} cases: "
            "overlapping windows, padding, strides 1 to 3, non-square kernels"
        ).format(n=len(cases))

    name = "conv2d_backward"
    return run_check("A1.3", name, body, max_points=A1_POINTS["A1.3"], verbose=verbose)
