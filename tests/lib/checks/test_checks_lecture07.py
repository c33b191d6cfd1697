"""Lecture 7's checks: the instructor's answers pass; the notebook's stubs, answers that call the
library's codec, error feedback or top-k, and plausible mistakes fail with a reason."""

from __future__ import annotations

import numpy as np
import pytest
from lecture07_answers import my_error_feedback_step, my_int8_quantize, my_top_k
from lecture_notebooks import notebook_function

from course_lib.checks.lecture07 import check_error_feedback, check_int8_quantize, check_top_k
from course_lib.compression import make_compressor
from course_lib.compression.error_feedback import ErrorFeedback
from course_lib.compression.int8 import int8_encode

NOTEBOOK = "07_compression.ipynb"


def library_error_feedback(g, residual, quantize):
    """The library's wrapper around a compressor that applies ``quantize``: one call."""
    from course_lib.compression.base import Compressor

    class Quantize(Compressor):
        name = "exercise"

        def compress(self, tensor, name=""):
            return quantize(tensor), None

        def decode_values(self, payload):
            return payload

    ef = ErrorFeedback(Quantize())
    ef.residuals["g"] = residual
    sent, _ = ef.compress(g, "g")
    return sent, ef.residuals["g"]


def library_top_k(g, k):
    payload, _ = make_compressor("topk", ratio=k / g.size).compress(g, "g")
    return payload.parts["indices"], payload.parts["values"]


@pytest.mark.parametrize(
    "check, answer, name",
    [
        (check_int8_quantize, my_int8_quantize, "my_int8_quantize"),
        (check_error_feedback, my_error_feedback_step, "my_error_feedback_step"),
        (check_top_k, my_top_k, "my_top_k"),
    ],
)
def test_answer_passes_and_notebook_stub_fails(check, answer, name):
    assert check(answer), check(answer).detail
    stub = check(notebook_function(NOTEBOOK, name))
    assert not stub and "not implemented yet" in stub.detail


def test_answers_through_the_library_are_refused():
    verdict = check_int8_quantize(int8_encode)
    assert not verdict and "course_lib.compression.int8.int8_encode" in verdict.detail
    verdict = check_int8_quantize(lambda g: make_compressor("int8").compress(g, "g")[0].parts)
    assert not verdict and "int8_encode, which answers" in verdict.detail, verdict
    verdict = check_error_feedback(library_error_feedback)
    assert not verdict and "ErrorFeedback.compress, which answers" in verdict.detail, verdict
    verdict = check_top_k(library_top_k)
    assert not verdict and "TopK.compress, which answers" in verdict.detail, verdict
    assert check_int8_quantize(my_int8_quantize)  # the library is restored afterwards
    assert int8_encode(np.ones(2, np.float32))[0].tolist() == [127, 127]


def test_plausible_mistakes_fail():
    def rounded(g):  # rounds to nearest: not the source's cast
        m = np.float32(np.abs(g).max())
        q = np.round(g / m * np.float32(127)) if m else np.zeros_like(g)
        return q.astype(np.int8), m

    def forgets_the_residual(g, residual, quantize):
        return quantize(g), residual

    def smallest(g, k):
        idx = np.argsort(np.abs(g))[:k]
        return idx, g[idx]

    assert "truncates toward zero" in check_int8_quantize(rounded).detail
    assert "residual must keep" in check_error_feedback(forgets_the_residual).detail
    assert "not the" in check_top_k(smallest).detail
