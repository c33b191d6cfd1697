"""Lecture 14's checks: the instructor's answers pass; the notebook's stubs, the typical mistakes
(an online softmax that does not rescale or skips the maximum, a contiguous split for the
zig-zag) and an answer that calls the library's vocabulary-parallel loss fail, each saying why."""

from __future__ import annotations

import pytest
from lecture14_answers import my_online_softmax, my_vocab_loss, my_zigzag
from lecture_notebooks import notebook_function

from course_lib.checks.lecture14 import check_online_softmax, check_vocab_loss, check_zigzag

pytestmark = pytest.mark.timeout(300)
NOTEBOOK = "14_transformer_parallelism.ipynb"


def no_rescale(m, ell, acc, scores, values):
    import torch

    m_new = torch.maximum(m, scores.amax(1))
    e = torch.exp(scores - m_new.unsqueeze(1))
    return m_new, ell + e.sum(1), acc + e @ values


def no_maximum(m, ell, acc, scores, values):
    import torch

    e = torch.exp(scores)
    return torch.maximum(m, scores.amax(1)), ell + e.sum(1), acc + e @ values


def test_online_softmax():
    assert check_online_softmax(my_online_softmax, verbose=False)
    stub = check_online_softmax(notebook_function(NOTEBOOK, "my_online_softmax"), verbose=False)
    assert not stub and "not implemented" in stub.detail
    wrong = check_online_softmax(no_rescale, verbose=False)
    assert not wrong and "when m changes" in wrong.detail, wrong.detail
    wrong = check_online_softmax(no_maximum, verbose=False)
    assert not wrong and "overflowed" in wrong.detail, wrong.detail


def test_zigzag():
    assert check_zigzag(my_zigzag, verbose=False)
    stub = check_zigzag(notebook_function(NOTEBOOK, "my_zigzag"), verbose=False)
    assert not stub and "not implemented" in stub.detail
    contiguous = check_zigzag(lambda t, p, r: range(r * t // p, (r + 1) * t // p), verbose=False)
    assert not contiguous and "not balanced" in contiguous.detail
    twice = check_zigzag(lambda t, p, r: range(t // p), verbose=False)
    assert not twice and "exactly once" in twice.detail


@pytest.fixture(scope="module")
def cluster(shared_engines):
    from course_lib.comm import setup_communicators

    cluster = shared_engines(2)  # from the session's pool (tests/conftest.py)
    setup_communicators(cluster, backend="gloo", timeout=60)
    return cluster


def library_loss(comm, logits, target, bounds):
    from course_lib.parallel.transformer.vocab import vocab_parallel_cross_entropy

    return vocab_parallel_cross_entropy(logits, target, comm, bounds)


def gathering_loss(comm, logits, target, bounds):
    import torch
    import torch.nn.functional as F

    a, b = bounds  # put this rank's classes into a whole (M, vocab) matrix and sum it
    vocab = int(comm.allreduce(torch.tensor([b]), op="max")[0])
    full = torch.zeros(len(target), vocab)
    full[:, a:b] = logits
    return F.cross_entropy(comm.allreduce(full), target, reduction="none")


def test_vocab_loss_on_engines(cluster):
    assert check_vocab_loss(my_vocab_loss, cluster, verbose=False)
    stub = check_vocab_loss(notebook_function(NOTEBOOK, "my_vocab_loss"), cluster, verbose=False)
    assert not stub and "not implemented" in stub.detail, stub.detail
    library = check_vocab_loss(library_loss, cluster, verbose=False)
    assert not library and "vocab.vocab_parallel_cross_entropy" in library.detail, library.detail
    gathered = check_vocab_loss(gathering_loss, cluster, verbose=False)
    assert not gathered and "never the logits" in gathered.detail, gathered.detail
    assert check_vocab_loss(my_vocab_loss, cluster, verbose=False)  # the library is restored
