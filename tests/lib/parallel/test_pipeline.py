"""Pipeline parallelism: the schedules on paper (exact), and on real engines (gloo over 2, 3 and 4
local engines, sub-communicators of one 4-engine world) against one process.

Tolerance for "equals one process": float32. The pipeline sums each parameter's gradient over m
micro-batches (each a mean divided by m) where one process takes one mean over the batch, so the
two differ by rounding only (~1e-7 relative); after 3 SGD steps we allow atol 1e-5. GPipe and
1F1B run the very same per-micro-batch computations and accumulate in the same order (micro-batch
0 first), so their gradients must be bitwise equal; so does interleaved 1F1B, whose chunks run the
same layers on the same inputs and accumulate each layer's gradient in micro-batch order too.

The measured bubble of a balanced pipeline is not asserted here: 4 engines share 2 cores, so
stages do not really run at once; ``bench/bench_model_parallel.py`` prints it beside the formula.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from torch import nn

from course_lib.parallel.pipeline_parallel.interleaved import Interleaved1F1B, pipeline_messages
from course_lib.parallel.pipeline_parallel.pipeline import (
    PipelineSettings,
    balance_stages,
    even_stages,
    measure_layer_costs,
    split_stages,
)
from course_lib.parallel.pipeline_parallel.schedule import (
    SCHEDULES,
    action_chunk,
    bubble_formula,
    bubble_ratio_formula,
    in_flight,
    in_flight_formula,
    schedule,
    simulate,
)

ATOL = 1e-5


def make_model(hidden: int = 3) -> nn.Sequential:
    """Seven layers (``hidden`` = 3), so 2, 3 and 4 stages all work (3 unevenly); 2 more a hidden."""
    layers: list[nn.Module] = [nn.Linear(12, 16), nn.Tanh()]
    for _ in range(hidden - 1):
        layers += [nn.Linear(16, 16), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(16, 5))


# ---- on paper --------------------------------------------------------------------------------
@pytest.mark.parametrize("p, m", [(1, 1), (2, 1), (2, 3), (3, 4), (4, 4), (4, 8), (5, 16)])
def test_simulated_bubble_equals_the_formula_exactly(p, m):
    f = [Fraction(3)] * p  # exact arithmetic: the equality is exact, not approximate
    for name in ("gpipe", "1f1b"):
        timeline = simulate(name, f, m, backward_costs=[Fraction(5)] * p)
        assert timeline.bubble_fraction == Fraction(p - 1, m + p - 1), name
    assert simulate("gpipe", [1] * p, m).bubble_fraction == bubble_formula(p, m)
    assert simulate("naive", f, m).bubble_fraction == Fraction(p - 1, p)


def test_simulated_memory_gpipe_keeps_m_1f1b_keeps_p_minus_stage():
    p, m = 4, 8
    assert simulate("gpipe", [1] * p, m).peak_activations == [m] * p
    assert simulate("1f1b", [1] * p, m).peak_activations == [4, 3, 2, 1]
    assert simulate("naive", [1] * p, m).peak_activations == [1] * p


@pytest.mark.parametrize("p, m", [(1, 1), (2, 1), (3, 2), (4, 4), (4, 8), (5, 16), (8, 3)])
def test_in_flight_micro_batches_per_stage_read_from_the_schedules_equal_the_formula(p, m):
    # Lecture 11: GPipe holds all m micro-batches' activations on every stage at its peak; 1F1B
    # holds at most p - s on stage s (fewer when m is smaller), whatever the timing.
    for name in SCHEDULES:
        got = in_flight(name, p, m)
        assert got == [in_flight_formula(name, p, m, s) for s in range(p)], name
        assert got == simulate(name, [1] * p, m).peak_activations  # the timed run agrees
    assert in_flight("1f1b", p, m) == [min(p - s, m) for s in range(p)]
    assert in_flight("gpipe", p, m) == [m] * p


def test_every_schedule_runs_each_microbatch_once_forward_before_backward():
    for name in SCHEDULES:
        for s in range(4):
            actions = schedule(name, 4, 6, s)
            assert sorted(actions) == sorted(
                [("F", i) for i in range(6)] + [("B", i) for i in range(6)]
            )
            assert all(actions.index(("F", i)) < actions.index(("B", i)) for i in range(6))


# Narayanan et al. 2021, section 2.2.2: with v chunks per rank the bubble is (p-1)/(vm) of the
# ideal time. Counted in schedule slots (exact fractions), for backward = 2, 1 and 5/3 forwards.
@pytest.mark.parametrize("p", [2, 3, 4, 5])
@pytest.mark.parametrize("v", [1, 2, 3, 4])
def test_interleaved_bubble_equals_the_formula_exactly(p, v):
    for m in (p, 2 * p, 4 * p):
        for forward, backward in ((1, 2), (1, 1), (3, 5)):
            t = simulate(Interleaved1F1B(v), [Fraction(forward)] * p, m, [Fraction(backward)] * p)
            assert t.bubble_ratio == Fraction(p - 1, v * m), (m, forward, backward)
            assert t.bubble_fraction == Fraction(p - 1, v * m + p - 1)
            assert bubble_formula(p, m, v) == float(t.bubble_fraction)
            assert bubble_ratio_formula(p, m, v) == float(t.bubble_ratio)
    # the plain schedules' bubble over the ideal time: (p-1)/m, the paper's form of GPipe's
    assert simulate("1f1b", [Fraction(1)] * p, 2 * p).bubble_ratio == Fraction(p - 1, 2 * p)


@pytest.mark.parametrize("p, m, v", [(2, 4, 2), (3, 6, 3), (4, 8, 2), (4, 4, 2), (2, 2, 4)])
def test_interleaved_runs_each_microbatch_once_per_chunk_in_the_models_order(p, m, v):
    assert Interleaved1F1B(v).num_chunks == v
    for s in range(p):
        actions = schedule(Interleaved1F1B(v), p, m, s)
        want = [(k, i, c) for k in "FB" for i in range(m) for c in range(v)]
        assert sorted(actions) == sorted(want)
        at = {a: n for n, a in enumerate(actions)}
        for i in range(m):
            for c in range(v):
                assert at["F", i, c] < at["B", i, c]
                if c:  # chunk c - 1 feeds chunk c (round the ring); the backward runs back
                    assert at["F", i, c - 1] < at["F", i, c] and at["B", i, c] < at["B", i, c - 1]
    assert [action_chunk(a) for a in [("F", 3), ("B", 2, 1)]] == [0, 1]


def test_interleaved_with_one_chunk_is_1f1b_and_bad_settings_name_the_fix():
    for s in range(4):
        assert schedule(Interleaved1F1B(1), 4, 6, s) == schedule("1f1b", 4, 6, s)
    with pytest.raises(ValueError, match="choose m a multiple of 4"):
        Interleaved1F1B(2)(4, 6, 0)
    with pytest.raises(ValueError, match="num_chunks must be a whole number >= 1"):
        Interleaved1F1B(0)
    with pytest.raises(ValueError, match="11 model chunks exceed the 10"):
        PipelineSettings(Interleaved1F1B(11), 4, 16)
    assert PipelineSettings(Interleaved1F1B(3), 4, 16).num_chunks == 3


def test_interleaving_pays_v_times_the_messages():
    # each micro-batch crosses pv - 1 boundaries between ranks, forward and backward
    assert pipeline_messages(4, 8) == 2 * 8 * 3
    assert pipeline_messages(4, 8, 2) == 2 * 8 * 7
    for p, m, v in ((2, 4, 3), (4, 8, 2), (5, 10, 4)):
        # read from the schedules: every action but the first stage's forwards and the last
        # stage's backwards receives one tensor from a neighbour rank
        received = sum(
            1
            for s in range(p)
            for a in schedule(Interleaved1F1B(v), p, m, s)
            if not (a[0] == "F" and action_chunk(a) * p + s == 0)
            and not (a[0] == "B" and action_chunk(a) * p + s == p * v - 1)
        )
        assert received == pipeline_messages(p, m, v)


def test_a_backward_before_its_own_forward_is_a_deadlock_not_a_free_slot():
    # the last stage has no neighbour to wait for on a backward, but it needs its own forward
    with pytest.raises(RuntimeError, match="deadlocks"):
        simulate(lambda p, m, s: [("B", 0), ("F", 0)], [1, 1], 1)


def test_uneven_stages_make_the_slowest_stage_set_the_pace():
    timeline = simulate("gpipe", [1, 1, 3], 8, backward_costs=[1, 1, 3])
    assert timeline.makespan >= 8 * 6  # stage 2 alone is busy 8 * (3 + 3)
    assert timeline.bubble_fraction > bubble_formula(3, 8)


def test_balance_stages_minimises_the_slowest_stage():
    assert balance_stages([1, 1, 1, 1, 4], 2) == [(0, 4), (4, 5)]
    assert balance_stages([4, 1, 1, 1, 1, 4], 3) == [(0, 1), (1, 5), (5, 6)]
    assert balance_stages([1.0] * 7, 7) == [(i, i + 1) for i in range(7)]
    costs = measure_layer_costs(make_model(), torch.randn(8, 12), repeats=2)
    assert len(costs) == 7 and all(c > 0 for c in costs)


def test_split_stages_cuts_the_course_cnns_sharing_their_layers():
    from course_lib.training.models import LeNet, SmallCNN

    for model in (LeNet(), SmallCNN()):
        stages = split_stages(model, even_stages(len(model), 2))
        assert [len(s) for s in stages] == [len(model) // 2, len(model) - len(model) // 2]
        assert all(a is b for a, b in zip([m for s in stages for m in s], model, strict=True))


def test_bad_pipeline_input_names_the_fix():
    with pytest.raises(ValueError, match="cannot cut a model of 7 layers into 8 stages.*at most 7"):
        even_stages(7, 8)
    with pytest.raises(ValueError, match="at most 2 engines"):
        balance_stages([1.0, 2.0], 3)
    with pytest.raises(ValueError, match=r"divisors of the batch size \[1, 2, 5, 10\]"):
        PipelineSettings("gpipe", num_microbatches=3, batch_size=10)
    with pytest.raises(ValueError, match="choose one of"):
        PipelineSettings("pipedream", 2, 4)
    with pytest.raises(ValueError, match="must cover layers 0..7"):
        split_stages(make_model(), [(0, 3), (4, 7)])


# ---- on engines ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(shared_engines):
    """The session's 4 pooled engines, with gloo ``comm`` and ``comm2..comm4`` for this module."""
    cluster = shared_engines(4)
    cluster.run(_import_torch, timeout=180)
    _communicators(cluster)
    return cluster


def _communicators(cluster) -> None:
    from course_lib.comm import setup_communicators

    setup_communicators(cluster, backend="gloo", timeout=20)
    cluster.run(_make_subgroups, timeout=60)


def _import_torch() -> None:
    import torch  # noqa: F401


def _make_subgroups() -> None:
    from IPython import get_ipython

    ns = get_ipython().user_ns
    for size in (2, 3, 4):  # every rank calls subgroup, ranks outside get None
        ns[f"comm{size}"] = ns["comm"].subgroup(list(range(size)))


def _train(size: int, name, m: int, steps: int, hidden: int = 3, batch: int = 16) -> dict | None:
    """Train ``make_model(hidden)`` ``steps`` steps pipelined over ``comm{size}`` and in one process.

    ``name`` is a schedule's name or object; with v chunks the model is cut into ``size * v``
    stages and this rank holds stages ``rank, rank + size, ...``.
    """
    import copy

    import torch
    from IPython import get_ipython

    from course_lib.parallel.pipeline_parallel.pipeline import (
        PipelineSettings,
        even_stages,
        pipeline_step,
    )
    from course_lib.parallel.pipeline_parallel.pipeline import split_stages as split

    comm = get_ipython().user_ns[f"comm{size}"]
    if comm is None:
        return None
    torch.manual_seed(0)
    model = make_model(hidden)
    ref, start = copy.deepcopy(model), copy.deepcopy(model)
    X, y = torch.randn(steps, batch, 12), torch.randint(0, 5, (steps, batch))
    settings = PipelineSettings(name, m, batch)
    v = settings.num_chunks
    bounds = even_stages(len(model), size * v)
    chunks, ref_chunks = (
        split(model, bounds)[comm.rank :: size],
        split(ref, bounds)[comm.rank :: size],
    )
    stage, ref_stage = (chunks[0], ref_chunks[0]) if v == 1 else (chunks, ref_chunks)
    mine = [j for a, b in bounds[comm.rank :: size] for j in range(a, b)]  # this rank's layers
    opt, ref_opt = (torch.optim.SGD(n.parameters(), lr=0.3) for n in (model, ref))
    first, last = comm.rank == 0, comm.rank == size - 1
    out: dict = {"losses": [], "ref_losses": []}
    for step in range(steps):
        opt.zero_grad()
        comm.stats.reset()
        loss, timeline = pipeline_step(
            stage, comm, settings, X[step] if first else None, y[step] if last else None
        )
        if step == 0:  # layer index -> its parameters' gradients
            out["grads"] = {j: [p.grad.numpy().copy() for p in model[j].parameters()] for j in mine}
            out["messages"] = comm.stats.messages_sent
        opt.step()
        ref_opt.zero_grad()
        ref_loss = torch.nn.functional.cross_entropy(ref(X[step]), y[step])
        ref_loss.backward()
        ref_opt.step()
        out["losses"].append(loss)
        out["ref_losses"].append(ref_loss.item())
    out["error"] = max(
        (
            (a - b).abs().max().item()
            for c, ref_c in zip(chunks, ref_chunks, strict=True)
            for a, b in zip(c.parameters(), ref_c.parameters(), strict=True)
        ),
        default=0.0,  # a rank whose chunks are all Tanh holds no weights
    )
    out["moved"] = max(  # how far training took the weights (the same on every rank)
        (a - b).abs().max().item()
        for a, b in zip(model.parameters(), start.parameters(), strict=True)
    )
    out["peak"] = timeline.peak_activations[0]
    out["peak_bytes"] = timeline.peak_activation_bytes[0]
    return out


class FailOnCall(nn.Module):
    """Identity that raises on its ``n``-th forward call (a bug in one stage)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.calls = n, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.n:
            raise ValueError("a bug in this stage")
        return x


def _failing_stage(name: str) -> str:
    import torch
    from IPython import get_ipython

    from course_lib.parallel.pipeline_parallel.pipeline import (
        PipelineSettings,
        even_stages,
        pipeline_step,
    )

    comm = get_ipython().user_ns["comm3"]
    if comm is None:
        return "not in the pipeline"
    comm.timeout = 4.0  # the neighbours of the failing stage give up after 4 s
    torch.manual_seed(0)
    model = make_model()
    stage = split_stages(model, even_stages(len(model), 3))[comm.rank]
    if comm.rank == 1:
        stage = nn.Sequential(*stage, FailOnCall(3))  # fails on micro-batch 2's forward
    X, y = torch.randn(16, 12), torch.randint(0, 5, (16,))
    try:
        pipeline_step(stage, comm, PipelineSettings(name, 4, 16), X, y)
    except Exception as exc:  # noqa: BLE001 - the test reads every rank's message
        return f"{type(exc).__name__}: {exc}"
    return "no error"


@pytest.mark.timeout(400)
def test_every_schedule_trains_like_one_process_and_gpipe_equals_1f1b(cluster):
    for size in (2, 3, 4):
        grads = {}
        for name in SCHEDULES if size == 3 else ("gpipe", "1f1b"):  # naive once: it is slow
            results = [r for r in cluster.run(_train, size, name, 4, 3, timeout=120) if r]
            assert len(results) == size
            _assert_trained_like_one_process(results, size, name)
            grads[name] = [r["grads"] for r in results]
        for rank in range(size):
            for j, g_gpipe in grads["gpipe"][rank].items():
                for a, b in zip(g_gpipe, grads["1f1b"][rank][j], strict=True):
                    assert np.array_equal(a, b), (size, rank, j)


def _assert_trained_like_one_process(results: list[dict], size: int, name) -> None:
    assert len(results) == size
    for rank, res in enumerate(results):
        assert res["error"] < ATOL, (size, name, rank, res["error"])
    last = results[-1]
    np.testing.assert_allclose(last["losses"], last["ref_losses"], atol=ATOL)
    assert last["moved"] > 1e-3  # it really trained (3 steps on 3 random batches)


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    "size, v, m, hidden, batch",
    [(2, 2, 4, 3, 16), (2, 3, 4, 3, 16), (3, 2, 6, 3, 24), (4, 2, 8, 4, 16), (4, 2, 4, 4, 16)],
)
def test_interleaved_1f1b_trains_like_one_process_with_1f1b_gradients(
    cluster, size, v, m, hidden, batch
):
    # Interleaved 1F1B (Narayanan et al. 2021, section 2.2.2) on real ranks: every chunk's weights
    # equal one process's after 3 steps; each layer's first-step gradient is bitwise 1F1B's; the
    # ranks send 2m(pv - 1) tensors and one shape header per boundary between ranks.
    args = (m, 3, hidden, batch)
    results = [r for r in cluster.run(_train, size, Interleaved1F1B(v), *args, timeout=120) if r]
    _assert_trained_like_one_process(results, size, f"interleaved v={v}")
    plain = [r for r in cluster.run(_train, size, "1f1b", *args, timeout=120) if r]
    mine = {j: g for r in results for j, g in r["grads"].items()}
    theirs = {j: g for r in plain for j, g in r["grads"].items()}
    assert sorted(mine) == sorted(theirs) == list(range(2 * hidden + 1))
    for j, grads in mine.items():
        for a, b in zip(grads, theirs[j], strict=True):
            assert np.array_equal(a, b), j
    sent = sum(r["messages"] for r in results)
    assert sent == pipeline_messages(size, m, v) + size * v - 1, sent
    assert sum(r["messages"] for r in plain) == pipeline_messages(size, m) + size - 1


@pytest.mark.timeout(200)
def test_1f1b_stores_at_most_p_microbatches_gpipe_stores_m(cluster):
    m, p = 8, 4
    peaks = {
        name: [r["peak"] for r in cluster.run(_train, p, name, m, 1, timeout=120)]
        for name in SCHEDULES
    }
    assert peaks["gpipe"] == [m] * p
    assert peaks["1f1b"] == [4, 3, 2, 1]  # stage s keeps p - s
    assert peaks["naive"] == [1] * p


#: activation bytes one micro-batch of 2 samples leaves on each of 4 stages of make_model(), in
#: float32: the stage's input (the Linear's) and its Tanh's output (Tanh saves it); the last
#: stage the Linear's input and cross-entropy's log-probabilities (2 x 5), targets (2 int64) and
#: total weight (one float32).
LAST = 4 * 2 * (16 + 5) + 8 * 2 + 4
PER_MICROBATCH = [4 * 2 * (12 + 16), 4 * 2 * (16 + 16), 4 * 2 * (16 + 16), LAST]


@pytest.mark.timeout(200)
def test_activation_bytes_in_flight_per_stage_1f1b_against_gpipe(cluster):
    m, p = 8, 4
    assert even_stages(7, p) == [(0, 2), (2, 4), (4, 6), (6, 7)]  # what PER_MICROBATCH assumes
    for name in SCHEDULES:
        got = [r["peak_bytes"] for r in cluster.run(_train, p, name, m, 1, timeout=120)]
        want = [in_flight_formula(name, p, m, s) * PER_MICROBATCH[s] for s in range(p)]
        assert got == want, name


@pytest.mark.timeout(200)
def test_a_failing_stage_is_named_and_the_others_do_not_hang(cluster):
    for name in ("gpipe", "1f1b"):
        messages = cluster.run(_failing_stage, name, timeout=60)
        assert (
            "PipelineStageError: stage 1 (rank 1 of 3) failed in the forward pass of "
            "micro-batch 2" in messages[1]
        ), messages
        assert "a bug in this stage" in messages[1]
        for rank in (0, 2):  # the neighbours time out (or see the closed connection)
            assert messages[rank].startswith(f"PipelineStageError: stage {rank} "), messages
            assert "rank 1" in messages[rank], messages
        assert messages[3] == "not in the pipeline"
        _communicators(cluster)  # a gloo timeout breaks the group: make a fresh one


def test_lecture10_checks_pass_answers_and_fail_stubs_and_wrong_ones():
    # the checks refuse the library's own schedule and balancer: the instructor's answers pass
    from lecture10_answers import my_1f1b, my_balance

    from course_lib.checks.lecture10 import (
        check_balance,
        check_one_f_one_b,
        stub_balance,
        stub_one_f_one_b,
    )
    from course_lib.parallel.pipeline_parallel.schedule import gpipe_schedule

    assert check_one_f_one_b(my_1f1b, verbose=False).passed
    assert check_balance(my_balance, verbose=False).passed
    for check, stub in ((check_one_f_one_b, stub_one_f_one_b), (check_balance, stub_balance)):
        verdict = check(stub, verbose=False)
        assert not verdict.passed and "not implemented" in verdict.detail, verdict
    verdict = check_one_f_one_b(gpipe_schedule, verbose=False)  # right bubble, too much memory
    assert not verdict.passed and "1F1B stores at most" in verdict.detail, verdict
    verdict = check_balance(even_stages_by_count, verbose=False)
    assert not verdict.passed and "the best split's" in verdict.detail, verdict


def even_stages_by_count(costs, p):
    return even_stages(len(costs), p)
