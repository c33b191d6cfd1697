"""torchrun launches the kit's expert-parallel training: 2 real processes (gloo), each rank's
weights after 3 Adam steps within 1e-5 relative of one process, the same tokens dropped; and
torch.distributed.rpc trains an MLP split across two workers with distributed autograd and a
DistributedOptimizer, equal to one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(200)
def test_torchrun_world_trains_the_moe_equal_to_one_process(tmp_path):
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip("no torchrun beside this Python")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", "2", "-m",
           "course_lib.parallel.bridge.torchrun_moe", "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["worst"] < 1e-5 and r["dropped_equal"] for r in results), results


@pytest.mark.timeout(200)
def test_rpc_split_model_with_distributed_autograd_trains_equal_to_one_process(tmp_path):
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip("no torchrun beside this Python")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", "2", "-m",
           "course_lib.parallel.bridge.rpc_split", "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "rpc.json").read_text())
    # every weight moved in training, and the split run equals one process
    assert result["names"] and result["moved"] > 1e-4 and result["worst"] < 1e-5, result


def test_outside_torchrun_it_names_the_launcher(monkeypatch):
    from course_lib.parallel.bridge.torchrun_moe import communicator_from_torchrun

    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(RuntimeError, match="start this with torchrun"):
        communicator_from_torchrun()
