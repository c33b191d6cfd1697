"""Lecture 15's checks: the instructor's answers pass; the notebook's stubs fail, and so do
answers that call the library (the built-in all-to-all, the pairwise one, the router) and
typical mistakes (blocks combined in the wrong order, second choices before first ones)."""

from __future__ import annotations

import pytest
from lecture15_answers import my_all_to_all, my_route
from lecture_notebooks import notebook_function

from course_lib.checks.lecture15 import check_all_to_all, check_route

pytestmark = pytest.mark.timeout(300)
NOTEBOOK = "15_experts_and_composition.ipynb"


@pytest.fixture(scope="module")
def cluster(shared_engines):
    from course_lib.comm import setup_communicators

    cluster = shared_engines(3)  # 3 ranks: pairwise partners differ in every step
    setup_communicators(cluster, backend="gloo", timeout=60)
    return cluster


def builtin_all_to_all(comm, x):
    return comm.all_to_all(x)


def library_all_to_all(comm, x):
    from course_lib.collectives import pairwise_all_to_all

    return pairwise_all_to_all(comm, x)


def reversed_blocks(comm, x):
    """A typical mistake: receives from r+k what r-k sent (blocks land in the wrong place)."""
    import torch

    p, r = comm.world_size, comm.rank
    b = x.shape[0] // p
    out = x.clone()
    for k in range(1, p):
        dst, src = (r + k) % p, (r - k) % p
        got = torch.empty_like(x[:b])
        comm.sendrecv(x[dst * b : (dst + 1) * b].contiguous(), dst, got, src)
        out[dst * b : (dst + 1) * b] = got
    return out


def whole_buffer(comm, x):
    """A typical mistake: sends every rank the whole buffer, which then picks its block."""
    import torch

    p, r = comm.world_size, comm.rank
    b = x.shape[0] // p
    out = x.clone()
    for k in range(1, p):
        dst, src = (r + k) % p, (r - k) % p
        got = torch.empty_like(x)
        comm.sendrecv(x.contiguous(), dst, got, src)
        out[src * b : (src + 1) * b] = got[r * b : (r + 1) * b]
    return out


def test_all_to_all_answer_passes_and_stub_library_and_mistakes_fail(cluster):
    assert check_all_to_all(my_all_to_all, cluster, verbose=False)
    stub = check_all_to_all(notebook_function(NOTEBOOK, "my_all_to_all"), cluster, verbose=False)
    assert not stub and "not implemented" in stub.detail, stub.detail
    for fn, words in [
        (builtin_all_to_all, "Communicator.all_to_all"),
        (library_all_to_all, "pairwise_all_to_all"),
        (reversed_blocks, "not the one rank"),
        (whole_buffer, "more than the block"),
    ]:
        verdict = check_all_to_all(fn, cluster, verbose=False)
        assert not verdict and words in verdict.detail, (fn.__name__, verdict.detail)
    assert check_all_to_all(my_all_to_all, cluster, verbose=False)  # the library is restored


def second_choices_first(logits, k, cap):
    """A typical mistake: token by token, each token's choices in turn (not choice by choice)."""
    import torch

    T, E = logits.shape
    expert = torch.softmax(logits, dim=1).topk(k, dim=1).indices
    slot, used = torch.full((T, k), -1, dtype=torch.int64), [0] * E
    for t in range(T):
        for c in range(k):
            e = int(expert[t, c])
            if used[e] < cap:
                slot[t, c] = used[e]
            used[e] += 1
    return expert, slot


def overflow_kept(logits, k, cap):
    """A typical mistake: no capacity (overflow silently kept)."""
    expert, slot = my_route(logits, k, 10**6)
    return expert, slot


def test_route_answer_passes_and_stub_library_and_mistakes_fail():
    from course_lib.parallel.experts import route

    assert check_route(my_route, verbose=False)
    stub = check_route(notebook_function(NOTEBOOK, "my_route"), verbose=False)
    assert not stub and "not implemented" in stub.detail, stub.detail
    library = check_route(
        lambda lg, k, cap: (lambda r: (r.expert, r.slot))(route(lg, k, cap)), verbose=False
    )
    assert not library and "gating.route" in library.detail, library.detail
    for fn in (second_choices_first, overflow_kept):
        verdict = check_route(fn, verbose=False)
        assert not verdict and "slot differs" in verdict.detail, (fn.__name__, verdict.detail)
