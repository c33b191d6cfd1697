"""A1 graded out of the kernel's reach: what the kernel calls, what the grader checks.

The kernel (no torch, no ``course_lib``) calls the three answers on the grader's inputs; the
grader runs :mod:`course_grader.assignments.a1.checks`'s checks on the returned arrays, against torch, in its
own process. A1.2's run needs a loss and a schedule inside the kernel: NumPy versions of the
check's (the label-smoothed loss is A1.1's answer, so it is defined only in A1.2's probe,
after A1.1's probe has run).
"""

from __future__ import annotations

from course_grader.verdict.probe import ExerciseProbe, ProbeSpec

__all__ = ["a1_spec"]

_SGD_SETUP = """\
    def loss_and_grad(W, b, X, y, eps=0.1):
        n, k = len(y), W.shape[1]
        Z = X @ W + b
        Z = Z - Z.max(axis=1, keepdims=True)
        log_P = Z - np.log(np.exp(Z).sum(axis=1, keepdims=True))
        Q = np.full((n, k), eps / k)
        Q[np.arange(n), y] += 1.0 - eps
        G = (np.exp(log_P) - Q) / n
        return -(Q * log_P).sum() / n, X.T @ G, G.sum(axis=0)

    schedules = {
        "constant": lambda t: 0.1,
        "warmup_then_step": lambda t: 0.2 * min(1.0, (t + 1) / 4) * 0.5 ** (t // 6),
    }
"""


def a1_spec() -> ProbeSpec:
    """A1's probes: the inputs and checks of :mod:`course_grader.assignments.a1.checks` (imports torch)."""
    from course_grader.assignments.a1 import checks as a1

    return ProbeSpec(
        kernel_setup="import numpy as np\n",
        exercises={
            "A1.1": ExerciseProbe(
                a1.smoothed_cross_entropy_inputs,
                'smoothed_cross_entropy(case["W"].copy(), case["b"].copy(), case["X"].copy(), '
                'case["y"].copy(), case["eps"])',
                a1.check_smoothed_cross_entropy,
            ),
            "A1.2": ExerciseProbe(
                a1.sgd_inputs,
                'sgd_momentum(loss_and_grad, case["W"].copy(), case["b"].copy(), case["X"], '
                'case["y"], schedules[case["schedule"]], case["momentum"], case["weight_decay"], '
                'case["batch_size"], case["num_epochs"], np.random.default_rng(case["order_seed"]))',
                a1.check_sgd_momentum,
                _SGD_SETUP,
            ),
            "A1.3": ExerciseProbe(
                a1.conv2d_backward_inputs,
                'conv2d_backward(case["X"].copy(), case["K"].copy(), case["dY"].copy(), '
                'case["stride"], case["padding"])',
                a1.check_conv2d_backward,
            ),
        },
    )
