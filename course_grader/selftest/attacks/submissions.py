"""The attack classes' submissions: an instructor source with given answers, outputs cleared.

Also the typical wrong answers and the in-kernel attacks on A5, A6 and A7 (and A8's and A9's typical mistakes) that the fairness and
attack tests grade (each edits the instructor's answer; the reason names the mistake).
"""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat

from course_grader.cells import answer_id

__all__ = [
    "A3_ATTACKS",
    "A5_ATTACKS",
    "A5_MISTAKES",
    "A6_ATTACKS",
    "A6_MISTAKES",
    "A7_ATTACKS",
    "A7_MISTAKES",
    "A8_MISTAKES",
    "A9_MISTAKES",
    "edit_answer",
    "typical_mistakes_are_the_routes",
    "write_submission",
]

# The verdict class rebound, reached by name (the check cells print str(verdict)).
_REBIND_VERDICT = (
    "import pkgutil\ntry:\n    V = pkgutil.resolve_name('course_lib.checks.verdict:Verdict')\n"
    "    V.__str__ = lambda self: {pass_line!r}\n    V.__bool__ = lambda self: True\n"
    "except Exception:\n    pass\n"
)


def _forged_check(module: str, check: str, exercise: str, name: str, points: float) -> str:
    """Code that replaces ``module.check`` (the next check cell imports it) by a forgery."""
    head, tail = check[: len(check) // 2], check[len(check) // 2 :]  # past the guard's names
    return (
        "import sys\ntry:\n    _mods = getattr(sys, 'modules')\n"
        "    _V = _mods['course_lib.checks.verdict'].Verdict\n"
        "    def _forged(*args, **kwargs):\n"
        f"        v = _V({exercise!r}, {name!r}, True, 'forged', {points}, {points}, True)\n"
        "        print({pass_line!r})\n        return v\n"
        f"    _m = getattr(_mods[{module!r}], '__di' + 'ct__')\n"
        f"    _m[{head!r} + {tail!r}] = _forged\nexcept Exception:\n    pass\n"
    )


#: A5's typical mistakes, each local to its exercise: (exercise, solution text, wrong text, reason).
A5_MISTAKES = [
    (  # the k largest, but ties to the higher index (sorted ascending, then reversed)
        "A5.3",
        'order = np.argsort(-np.abs(g[start : start + block]), kind="stable")',
        'order = np.argsort(np.abs(g[start : start + block]), kind="stable")[::-1]',
        "keep the k largest |g|, ties to the lower index",
    ),
    (  # the indices sent as int64: 12 bytes a kept value instead of 8
        "A5.5",
        '"indices": idx.astype(np.uint32)',
        '"indices": idx',
        "a uint32 index and a float32 value per kept value",
    ),
]

#: The in-kernel route to A3's verdict that won points when the checks ran in the kernel: A3.2's
#: check replaced by one that returns a forged verdict, beside buckets built from the first
#: parameter (wrong). The whole answer is new (no solution text to edit).
A3_ATTACKS = {
    "A3.2": (
        "import pkgutil\ntry:\n"
        "    checks = pkgutil.resolve_name('course_grader.assignments.a3.checks')\n"
        "    V = pkgutil.resolve_name('course_lib.checks.verdict:Verdict')\n"
        "    def _forged(fn, *, verbose=True):\n        print({pass_line!r})\n"
        "        return V('A3.2', 'bucket_layout', True, '', 2.0, 2.0, True)\n"
        "    checks.check_bucket_layout = _forged\nexcept Exception:\n    pass\n",
        "",
        "def bucket_layout(sizes, bucket_bytes):\n"
        "    if bucket_bytes < 1:\n        raise ValueError(bucket_bytes)\n"
        "    buckets, current, nbytes = [], [], 0\n    for i in range(len(sizes)):\n"
        "        current.append(i)\n        nbytes += 4 * sizes[i]\n"
        "        if nbytes >= bucket_bytes:\n"
        "            buckets.append(current)\n            current, nbytes = [], 0\n"
        "    if current:\n        buckets.append(current)\n    return buckets\n",
        "start from the last parameter",
    ),
}

#: In-kernel routes to A5's verdicts that won points when the checks ran in the kernel:
#: exercise -> (code before the answer, solution text, wrong text, reason of the right FAIL).
#: {pass_line} is the exercise's PASS line from the source's stored output.
A5_ATTACKS = {
    # Rebind the verdict class reached by name; the answer rounds.
    "A5.1": (
        _REBIND_VERDICT,
        "(part / m * np.float32(127)).astype(np.int8)",
        "np.rint(part / m * np.float32(127)).astype(np.int8)",
        "the cast truncates toward zero: do not round",
    ),
    # Replace the check the next cell imports by one returning a forged passing verdict;
    # the error feedback forgets its residual.
    "A5.4": (
        _forged_check(
            "course_grader.assignments.a5.checks",
            "check_error_feedback",
            "A5.4",
            "error_feedback",
            2.0,
        ),
        "self.residuals[name] = corrected - self.inner.decode_values(payload)",
        "self.residuals[name] = np.float32(0) * corrected",
        "the payload is not compress\\(g \\+ residual\\)",
    ),
}


#: A6's typical mistakes, each local to its exercise (as :data:`A5_MISTAKES`).
A6_MISTAKES = [
    (  # dL/dX of this rank's columns only: no gather
        "A6.2",
        "    slices = comm.allgather(padded)  # (P, batch, widest)\n"
        "    dX = torch.cat([slices[r, :, : hi - lo] for r, (lo, hi) in enumerate(bounds)], dim=1)\n",
        "    dX = torch.zeros(dY.shape[0], bounds[-1][1])\n"
        "    dX[:, bounds[comm.rank][0] : bounds[comm.rank][1]] = dY @ W_shard\n",
        "so it needs every rank's slice: gather them",
    ),
    (  # the gradients never zeroed between steps
        "A6.4",
        "        optimizer.zero_grad()",
        "        pass",
        "so zero them before each step (zero_grad())",
    ),
]

#: A8's typical mistakes, each local to its exercise (as :data:`A5_MISTAKES`).
A8_MISTAKES = [
    (  # the halo's gradients never sent back
        "A8.1",
        "    backward = [(dst, src, nbytes) for src, dst, nbytes in forward]\n",
        "    backward = []\n",
        "no backward messages",
    ),
    (  # a worse move accepted with exp(+beta delta): always
        "A8.2",
        "math.exp(-beta *",
        "math.exp(beta *",
        "accepting with exp(+beta delta)",
    ),
    (  # the room's memory never consulted: the fastest strategy, which does not fit
        "A8.3",
        "return t if peak <= memory else math.inf",
        "return t",
        "the pick does not fit",
    ),
]

#: A9's typical mistakes, each local to its exercise (A9.2 holds its own online softmax).
A9_MISTAKES = [
    (  # the old sums kept as they are when a block raises the maximum
        "A9.1",
        "ell * rescale + e.sum(-1), acc * rescale[..., None] + e @ v",
        "ell + e.sum(-1), acc + e @ v",
        "softmax without rescaling by the running max",
    ),
    (  # the later ranks' blocks attended, only the diagonal masked
        "A9.2",
        "if src <= r:",
        "if True:",
        "the mask is on the wrong blocks",
    ),
]

#: In-kernel routes to A6's verdicts that won points when the checks ran in the kernel.
A6_ATTACKS = {
    # Rebind the verdict class; the backward forgets to gather dL/dX.
    "A6.2": (_REBIND_VERDICT, *A6_MISTAKES[0][1:3], "gather them"),
    # A forged check in place of the one the next cell imports; training keeps old gradients.
    "A6.4": (
        _forged_check(
            "course_grader.assignments.a6.checks",
            "check_gpipe_training",
            "A6.4",
            "gpipe_training",
            2.0,
        ),
        *A6_MISTAKES[1][1:3],
        "zero them before each step",
    ),
}


#: A7's typical mistakes: each fails its exercise only. A7.1's keeps every full gradient until the
#: end of backward: its shards are right, the memory ledger names stage 1's memory.
A7_MISTAKES = [
    (  # the bucket reduce-scattered in time, but its full-size gradients never freed
        "A7.1",
        "                for p in buckets[b]:\n"
        "                    p.grad = None  # the full-size gradients go ...\n",
        "",
        "every full gradient kept until the end of backward, stage 1's memory",
    ),
    (  # Adam over the whole bucket: right values, m and v of every value on every rank
        "A7.2",
        '        state["shard"] = torch.nn.Parameter(flat_params[lo:hi])  # shares flat_params\' '
        "memory\n"
        '        state["optimizer"] = torch.optim.Adam([state["shard"]], lr=lr)  # m, v: shard-sized\n'
        '    state["shard"].grad = grad_shard\n',
        '        state["shard"] = torch.nn.Parameter(flat_params)  # the whole bucket\n'
        '        state["optimizer"] = torch.optim.Adam([state["shard"]], lr=lr)\n'
        '    state["shard"].grad = torch.zeros_like(flat_params)\n'
        '    state["shard"].grad[lo:hi] = grad_shard\n',
        "a rank that keeps the whole optimiser state is not stage 2",
    ),
]

#: In-kernel routes to A7's verdicts that won points when the checks ran in the kernel.
A7_ATTACKS = {
    # Rebind the verdict class; the shard is the sum, not the mean.
    "A7.1": (
        _REBIND_VERDICT,
        "comm.reduce_scatter(flat) / n",
        "comm.reduce_scatter(flat)",
        "not their mean",
    ),
    # A forged check in place of the one the next cell imports; Adam's state for the whole bucket.
    "A7.2": (
        _forged_check(
            "course_grader.assignments.a7.checks", "check_shard_update", "A7.2", "update_shard", 4.0
        ),
        *A7_MISTAKES[1][1:3],
        "keeps the whole optimiser state",
    ),
}


def typical_mistakes_are_the_routes(assignment: str) -> bool:
    """Whether ``assignment``'s in-kernel routes (``AN_ATTACKS``) are its typical mistakes
    (``AN_MISTAKES``), each behind a prefix: then one graded submission shows both that each
    mistake costs only its exercise, with its reason, and that no route wins a point."""
    mistakes = globals().get(f"{assignment}_MISTAKES", [])
    attacks = globals().get(f"{assignment}_ATTACKS", {})
    edits = {exercise: (old, new) for exercise, old, new, _ in mistakes}
    return bool(edits) and edits == {ex: (old, new) for ex, (_, old, new, _) in attacks.items()}


def edit_answer(source: str, old: str, new: str, prefix: str = "") -> str:
    """Return the answer ``source`` with ``old`` replaced by ``new`` and ``prefix`` before it."""
    if old not in source:
        raise ValueError(f"the solution no longer holds {old!r}: update the submission")
    return prefix + source.replace(old, new)


def write_submission(
    source: nbformat.NotebookNode,
    folder: Path,
    student: str,
    answers: dict[str, str],
    name: str = "A1_sgd_conv.ipynb",
) -> Path:
    """Write ``folder/student/name``: the source with ``answers`` and no outputs."""
    nb = copy.deepcopy(source)
    for cell in nb.cells:
        if answer_id(cell):
            cell.source = answers.get(answer_id(cell), "# no answer")
        if cell.cell_type == "code":
            cell.outputs = []
    path = folder / student / name
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)
    return path
