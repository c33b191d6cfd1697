"""Lecture 11's stage 3 in mixed precision against FSDP2's ``MixedPrecisionPolicy`` (gloo, CPU) on the
same model and batches, the bytes on the wire against (N-1)/N ((2 Psi - Psi_root) p + Psi r), and
the memory ledger against the mixed-precision formula (ZeRO's 2 + 2 + K = 12: 16 Psi / N at stage 3).

Two ranks: a sum of two 16-bit values is one rounding whoever adds them, so the kit's ring and
gloo's reduce-scatter agree bit for bit in bfloat16 (measured 0.0). In float16 FSDP2 halves the
gradients *before* the reduction (against overflow) and the kit after it: halving a float16
subnormal (below 6.1e-5) drops a bit, so the weights differ slightly (measured 1.7e-5).
"""

from __future__ import annotations

import pytest
import torch
from test_sharded import ADAM, RootOwned, relative_error, small_digits, uneven_mlp

from course_lib.parallel.data_parallel.train import train_data_parallel
from course_lib.parallel.sharded.audit import audit_bytes
from course_lib.parallel.sharded.bridge import train_torch_sharded
from course_lib.parallel.sharded.fsdp_unit import Zero3
from course_lib.parallel.sharded.mixed import check_dtypes, mixed_wire_bytes
from course_lib.parallel.sharded.precision import mixed_precision_bytes
from course_lib.parallel.sharded.units import root_unit, unit_sizes

pytestmark = pytest.mark.timeout(600)

N, PSI = 2, 1375  # uneven_mlp: 1 375 trainable values
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
#: Kit against FSDP2, relative to each tensor's largest value (bfloat16: 0.0; float16: 1.7e-5).
FSDP_RTOL = 1e-4


@pytest.fixture(scope="module")
def pool(shared_engines):
    return shared_engines(N)


def kit_run(pool, compute, reduce, model=uneven_mlp):
    return train_data_parallel(
        pool,
        model=model,
        dataset=small_digits,
        config=ADAM,
        method=Zero3(compute_dtype=compute, reduce_dtype=reduce),
        comm_timeout=30,
        timeout=300,
    )


@pytest.fixture(scope="module")
def float32_run(pool):
    return kit_run(pool, None, None)


@pytest.mark.parametrize(("compute", "reduce"), [(BF16, BF16), (BF16, F32), (F16, F16)])
def test_mixed_stage_3_trains_like_fsdp2_and_sends_the_formulas_bytes(
    pool, float32_run, compute, reduce
):
    kit = kit_run(pool, compute, reduce)
    ranks = pool.run(
        train_torch_sharded, "fsdp2", uneven_mlp, small_digits, ADAM, compute, reduce, timeout=300
    )
    assert relative_error(ranks[0]["weights"], kit.weights) <= FSDP_RTOL
    assert kit.history.last["train_loss"] == pytest.approx(ranks[0]["train_loss"], abs=1e-3)
    # it did compute in 16 bits: the weights are not float32's (bfloat16 10 %, float16 0.3 %)
    assert relative_error(kit.weights, float32_run.weights) > 1e-3
    net = uneven_mlp()
    rows = audit_bytes(kit.records, 3, unit_sizes(net, 3, N), N, compute.itemsize,
                       root_unit(net, 3), reduce.itemsize)  # fmt: skip
    assert rows and all(r["ok"] for r in rows), rows[0]
    want = mixed_wire_bytes(PSI, N, compute.itemsize, reduce.itemsize)
    assert all(abs(r["sent"] - want) <= 4 * 3 for r in rows)  # < a value per pass and unit


def test_the_ledger_holds_the_mixed_precision_formula_and_halves_the_gathered_unit(
    pool, float32_run
):
    kit = kit_run(pool, BF16, BF16)
    mixed, full = kit.records[-1], float32_run.records[-1]
    # 4 (float32 shard: the master) + 4 (float32 gradient shard) + 8 (m, v): the ZeRO paper's
    # 2 + 2 + 12 per value over N, cut differently; Adam's step counters (4 bytes each) on top.
    assert mixed["ledger_settled_bytes"] == pytest.approx(mixed_precision_bytes(3, PSI, N), abs=32)
    assert mixed["ledger_params_bytes"] == full["ledger_params_bytes"]  # float32 shards
    assert mixed["ledger_settled_bytes"] == full["ledger_settled_bytes"]
    # what 16 bits save at stage 3: the gathered unit in flight and the activations
    assert mixed["ledger_in_flight_bytes"] < full["ledger_in_flight_bytes"]
    assert mixed["ledger_activation_bytes"] * 2 == full["ledger_activation_bytes"]


def test_the_root_unit_is_gathered_once_in_the_compute_dtype(pool):
    kit = kit_run(pool, BF16, F32, model=RootOwned)
    net = RootOwned()
    sizes = unit_sizes(net, 3, N)
    rows = audit_bytes(kit.records, 3, sizes, N, 2, root_unit(net, 3), 4)
    assert root_unit(net, 3) and all(r["ok"] for r in rows), rows[0]


def test_stage_3_refuses_a_dtype_it_cannot_compute_in():
    assert check_dtypes(None, None) == (F32, F32)
    assert check_dtypes(BF16, None) == (BF16, BF16)  # FSDP2's default: reduce in param_dtype
    with pytest.raises(ValueError, match="compute_dtype=.*choose one of"):
        Zero3(compute_dtype=torch.int8)
    with pytest.raises(ValueError, match="reduce_dtype"):
        Zero3(compute_dtype=BF16, reduce_dtype=torch.float64)
    assert mixed_wire_bytes(PSI, 4, 4, 4) == 12 * 3 / 4 * PSI  # float32: 3 (N-1)/N Psi values
