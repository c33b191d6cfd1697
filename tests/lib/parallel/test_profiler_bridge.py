"""The bridge to PyTorch's tools on 2 real engines (gloo): torch.profiler traces read back by
code (one step's compute and communication events counted), and DeviceMesh / DTensor tensor
parallelism (ColwiseParallel, RowwiseParallel) equal to the kit's column / row-parallel MLP, and
with SequenceParallel on a whole TinyGPT block equal to lecture 14's tensor- and
sequence-parallel block (outputs, input and weight gradients, relative 1e-5)."""

from __future__ import annotations

import pytest

from course_lib.parallel.bridge import profile_step


def test_a_step_without_communication_has_compute_only(tmp_path):
    import torch

    net = torch.nn.Linear(8, 8)
    X = torch.randn(4, 8)
    summary, events = profile_step(lambda: net(X).sum().backward(), tmp_path / "t.json")
    assert (tmp_path / "t.json").is_file()
    assert summary.counts["communication"] == 0 and summary.overlap == 0.0
    names = {e["name"] for e in events}
    assert "aten::linear" in names and "aten::addmm" not in names  # outermost operators only
    assert summary.counts["compute"] == len(events) > 0


@pytest.fixture(scope="module")
def cluster(shared_engines):
    from course_lib.comm import setup_communicators

    cluster = shared_engines(2)
    setup_communicators(cluster, backend="gloo", timeout=60)
    return cluster


def _profiled_step() -> dict:
    import torch
    from IPython import get_ipython

    from course_lib.parallel.bridge import profile_step

    comm = get_ipython().user_ns["comm"]
    net, X = torch.nn.Linear(16, 16), torch.randn(8, 16)

    def step():
        y = net(X)
        z = comm.all_to_all(y.detach().contiguous())
        y.sum().backward()
        comm.allreduce(net.weight.grad)
        return z

    summary, _ = profile_step(step)
    return {"counts": summary.counts, "names": summary.names, "seconds": summary.seconds}


@pytest.mark.timeout(200)
def test_a_step_with_collectives_counts_them_from_the_trace(cluster):
    for res in cluster.run(_profiled_step):
        assert res["names"].get("gloo:all_to_all") == 1, res
        assert res["names"].get("gloo:all_reduce") == 1, res
        assert res["counts"]["compute"] >= 3 and res["seconds"]["communication"] > 0, res


def _device_mesh_case() -> dict:
    from IPython import get_ipython

    from course_lib.parallel.bridge import compare_mlp

    return compare_mlp(get_ipython().user_ns["comm"])


@pytest.mark.timeout(200)
def test_device_mesh_plans_equal_the_kits_tensor_parallel_mlp(cluster):
    for res in cluster.run(_device_mesh_case):
        assert res.pop("shard shapes equal") == 1.0
        assert max(res.values()) < 1e-5, res


def _device_mesh_block_case(sequence_parallel: bool) -> dict:
    from IPython import get_ipython

    from course_lib.parallel.bridge import compare_block

    return compare_block(get_ipython().user_ns["comm"], sequence_parallel)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tensor", "sequence"])
def test_device_mesh_plans_equal_the_kits_parallel_block(cluster, sequence_parallel):
    for res in cluster.run(_device_mesh_block_case, sequence_parallel, timeout=120):
        assert max(res.values()) < 1e-5, res
