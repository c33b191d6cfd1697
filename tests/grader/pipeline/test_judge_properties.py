"""Property tests of the data path: whatever a kernel prints, every judge returns a FAIL with a reason.

For every assignment the registry finds and every exercise of it, hypothesis draws what a
probe's line could hold (random, nested, non-finite, huge, lying ``.npy`` headers, extra
results, exceptions of any name, forged PIDs lines and wire records) and feeds it to
:func:`course_grader.verdict.probe.judge`: it must return ``(False, "FAIL (...)")`` and never
raise. The ranks' reports go through each assignment's claims and the wire check the same way.
No engines: a bounded, derandomised number of examples per exercise keeps this a few seconds.
"""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from course_grader.registry import assignments
from course_grader.verdict.probe import MARK, _claims, judge
from course_grader.verdict.wire import PIDS_MARK, wire_problem

SPECS = {name: factory() for name, factory in assignments().items()}
EXERCISES = [(name, ex) for name, spec in SPECS.items() for ex in spec.exercises]
CLAIMED = [(name, ex) for name, ex in EXERCISES if SPECS[name].exercises[ex].claims is not None]
SETTINGS = settings(
    max_examples=8,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)

NUMBERS = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([0, 1, 2, 3, 4, -1, 2**31, 2**62]),
    st.floats(allow_nan=True, allow_infinity=True),
)


def _npy(array: np.ndarray) -> dict:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return {"npy": base64.b64encode(buf.getvalue()).decode()}


def _lying(shape: tuple) -> dict:
    """An .npy whose header claims ``shape`` over 24 bytes: numpy would allocate the claim."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": "<f8", "fortran_order": False, "shape": shape}
    )
    buf.write(bytes(24))
    return {"npy": base64.b64encode(buf.getvalue()).decode()}


HUGE = _npy(
    np.zeros(2**17, np.int64)
)  # 1 MiB, built once (the 16 MiB bound: test_student_failure...)

arrays = st.one_of(
    st.builds(lambda xs: _npy(np.asarray(xs, np.int64)), st.lists(st.integers(-(2**40), 2**40), max_size=6)),
    st.builds(lambda xs: _npy(np.asarray(xs, np.float64)), st.lists(st.floats(), max_size=6)),
    st.builds(lambda x: _npy(np.asarray(x)), NUMBERS.filter(lambda x: not isinstance(x, int) or abs(x) < 2**62)),
    st.builds(_lying, st.sampled_from([(10**12,), (2, 10**11), (-1,), (4,), ()])),
    st.just(HUGE),
    st.just({"npy": "!!not base64!!"}),
)  # fmt: skip
leaves = st.one_of(
    arrays,
    st.just({"none": 1}),
    st.builds(lambda s: {"str": s}, st.text(max_size=20)),
    st.builds(lambda s: {"type": s}, st.sampled_from(["Tensor", "function", "x" * 100])),
    NUMBERS,
    st.none(),
    st.booleans(),
    st.text(max_size=5),
)
values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.builds(lambda xs: {"tuple": xs}, st.lists(inner, max_size=7)),
        st.builds(lambda xs: {"list": xs}, st.lists(inner, max_size=7)),
        st.dictionaries(st.sampled_from(["tuple", "list", "npy", "x"]), inner, max_size=2),
    ),
    max_leaves=40,
)
errors = st.fixed_dictionaries(
    {
        "error": st.sampled_from(["NotImplementedError", "UnicodeDecodeError", "SystemExit",
                                  "KeyboardInterrupt", "Nope", "1bad name", "OSError"]),
        "message": st.text(max_size=30),
        "line": st.one_of(st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=3)),
    }
)  # fmt: skip
results = st.lists(st.one_of(st.builds(lambda v: {"value": v}, values), errors, leaves), max_size=8)
pids = st.one_of(
    st.lists(st.integers(-5, 2**23), max_size=6).map(json.dumps),
    st.integers(1, 20_000).map(lambda n: "[" * n + "]" * n),
    st.sampled_from(["[1, NaN]", "[1e999]", "[true]", "[[1], [2]]", '{"0": 1}', "]["]),
)
wires = st.one_of(
    st.none(),
    st.just({"error": "the sockets could not be read"}),
    st.fixed_dictionaries(
        {
            "flows": st.lists(
                st.tuples(st.lists(st.integers(0, 9), max_size=3),
                          st.lists(st.integers(0, 9), max_size=3), st.integers(0, 10**6)),
                max_size=6,
            ),
            "unaccounted": st.integers(0, 10**4),
        }
    ),
)  # fmt: skip


@st.composite
def printed(draw) -> str:
    """What a probe cell's stdout could hold: its line (or a forgery), a PIDs line, noise."""
    body = json.dumps(draw(results))
    lines = [draw(st.sampled_from(["", "noise", MARK + "[" * 500]))]
    lines.append(MARK + body)
    if draw(st.booleans()):
        lines.append(PIDS_MARK + draw(pids))
    return "\n".join(lines)


@pytest.mark.parametrize(("assignment", "exercise"), EXERCISES, ids=[e for _, e in EXERCISES])
@SETTINGS
@given(stdout=printed(), wire=wires)
def test_any_printed_line_is_a_fail_with_a_reason(assignment, exercise, stdout, wire):
    passed, reason = judge(SPECS[assignment], exercise, 7, stdout, wire)
    assert passed is False and reason.startswith("FAIL (") and len(reason) > 7, reason


# The ranks' lines the engine exercises return: (rank, world size, data..., built-ins, peers).
rank_lines = st.lists(
    st.lists(
        st.tuples(NUMBERS, NUMBERS, values, st.lists(st.sampled_from(["barrier", "allreduce", "x"]),
                  max_size=3), st.lists(st.lists(NUMBERS, min_size=4, max_size=5), max_size=5))
        | st.tuples(NUMBERS, NUMBERS, st.text(max_size=5), NUMBERS),
        max_size=5,
    ),
    max_size=4,
)  # fmt: skip


@pytest.mark.parametrize(("assignment", "exercise"), CLAIMED, ids=[e for _, e in CLAIMED])
@SETTINGS
@given(cases=rank_lines, wire=wires, extra=results)
def test_any_report_is_claims_or_a_reason_and_the_wire_check_returns(
    assignment, exercise, cases, wire, extra
):
    probe = SPECS[assignment].exercises[exercise]
    raw = [{"value": _encoded(case)} for case in cases] + [r for r in extra if isinstance(r, dict)]
    claims = _claims(probe, raw)
    if isinstance(claims, str):
        assert claims.startswith("the ranks' byte counts "), claims
        return
    problem = wire_problem(claims, wire or {"flows": [], "unaccounted": 0}, "", probe.wire_slack)
    assert problem is None or isinstance(problem, str)


def _encoded(value) -> dict:
    """``value`` (tuples, lists, numbers, strings) in the kernel's encoding, as the probe prints it."""
    if isinstance(value, (tuple, list)):
        return {type(value).__name__: [_encoded(v) for v in value]}
    if isinstance(value, dict):
        return value  # already encoded
    if isinstance(value, str):
        return {"str": value}
    if value is None:
        return {"none": 1}
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
        return {"type": "int"}
    return _npy(np.asarray(value))


def test_the_strategies_reach_the_claims():
    """A well-formed report passes the door: the properties above test the claims, not only it."""
    probe = SPECS["A2"].exercises["A2.1"]
    lines = [(r, 2, np.zeros(2), [], [[1 - r, 1, 1, 8]]) for r in (0, 1)]
    claims = _claims(probe, [{"value": _encoded(lines)}])
    assert claims == {(0, 1): (8, 1, 0), (1, 0): (8, 1, 0)}, claims
