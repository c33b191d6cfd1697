"""The small decoder-only transformer and its offline text: parameters by the formula, causality,
it learns, and sharded data parallelism on 2 engines equals one process on it: ZeRO stage 2 with
SGD, stage 3 with Adam (with the ledger's bytes per rank against the formula)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from course_lib.data import load_dataset
from course_lib.data.text import VOCAB, decode, encode, load_text, stdlib_text
from course_lib.parallel.data_parallel.reference import train_one_process
from course_lib.parallel.data_parallel.train import train_data_parallel
from course_lib.parallel.sharded.ledger import LEDGER_KEYS, formula_bytes
from course_lib.training.loop import TrainConfig
from course_lib.training.models import build_model, param_count
from course_lib.training.transformer import TinyGPT, block_collectives, gpt_param_count

#: A small configuration for the engines: 2 blocks of width 32 over windows of 16 characters.
small_gpt = functools.partial(TinyGPT, block=16, d_model=32, n_head=4, n_layer=2)


def small_text() -> TensorDataset:
    """The first 96 windows of 16 characters."""
    x, y = load_text(block=16).tensors
    return TensorDataset(x[:96], y[:96])


@pytest.mark.parametrize("sizes", [(96, 64, 192, 6), (96, 16, 32, 2), (50, 8, 12, 3)])
def test_the_parameter_count_follows_the_formula(sizes):
    vocab, block, d, layers = sizes
    net = TinyGPT(vocab, block, d, n_head=2, n_layer=layers)
    assert param_count(net) == gpt_param_count(vocab, block, d, layers)
    assert param_count(build_model("tiny_gpt")) == 2_718_816  # "a few million"
    assert block_collectives(6) == {"forward": 12, "backward": 12}


def test_a_position_never_sees_the_future():
    torch.manual_seed(0)
    net = small_gpt().eval()
    x = torch.randint(0, 96, (2, 16))
    later = x.clone()
    later[:, 9:] = (later[:, 9:] + 1) % 96  # change every token from position 9 on
    a, b = net(x), net(later)
    assert a.shape == (2, 96, 16)
    assert torch.equal(a[:, :, :9], b[:, :, :9])
    assert not torch.allclose(a[:, :, 9:], b[:, :, 9:])


def test_the_text_is_offline_characters_and_its_targets_are_the_next_ones():
    text = stdlib_text()
    assert len(text) > 50_000 and len(VOCAB) == 96
    assert decode(encode("Return x\n")) == "Return x\n" and decode(encode("é")) == "?"
    x, y = load_text(block=32).tensors
    assert x.shape[1] == 32 and torch.equal(x[0, 1:], y[0, :-1]) and torch.equal(x[1, 0], y[0, -1])
    test_x, _ = load_dataset("text", train=False, block=32).tensors
    assert 0 < len(test_x) < len(x) / 5
    with pytest.raises(ValueError, match="block must be at least 2"):
        load_text(block=1)


def test_it_learns_the_text():
    torch.manual_seed(0)
    net = small_gpt()
    x, y = small_text().tensors
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    losses = []
    for step in range(40):
        idx = torch.arange(step * 16, (step + 1) * 16) % len(x)
        loss = torch.nn.functional.cross_entropy(net(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > np.log(96) * 0.9  # about uniform over the characters at the start
    assert np.mean(losses[-5:]) < losses[0] - 1.0


def test_bad_sizes_name_the_fix():
    with pytest.raises(ValueError, match="must divide into n_head=5 heads"):
        TinyGPT(d_model=32, n_head=5)
    with pytest.raises(ValueError, match="longer than the model's block of 16"):
        small_gpt()(torch.zeros(1, 17, dtype=torch.int64))


@pytest.mark.timeout(600)
def test_zero2_on_the_transformer_equals_one_process(shared_engines):
    # SGD with momentum, not Adam: the attention's key bias gets a zero gradient in exact
    # arithmetic (softmax ignores a shift shared by every key), so its gradient is rounding
    # noise, which Adam's division by sqrt(v) turns into full-size steps of either sign.
    config = TrainConfig(num_epochs=1, batch_size=32, lr=0.1, momentum=0.9, seed=4)
    result = train_data_parallel(
        shared_engines(2),
        model=small_gpt,
        dataset=small_text,
        config=config,
        method="zero2",
        world_size=2,
        comm_timeout=30,
        timeout=300,
    )
    reference = train_one_process(small_gpt, small_text, config)
    assert result.replicas_equal
    for name, w in reference.items():
        np.testing.assert_allclose(result.weights[name], w, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.timeout(600)
def test_zero3_with_adam_on_the_transformer_equals_one_process(shared_engines):
    config = TrainConfig(num_epochs=1, batch_size=32, lr=3e-3, optimizer="adam", seed=4)
    run = functools.partial(
        train_data_parallel,
        shared_engines(2),
        model=small_gpt,
        dataset=small_text,
        config=config,
        world_size=2,
        comm_timeout=30,
        timeout=300,
    )
    result, ddp = run(method="zero3"), run(method="zero0")
    assert result.replicas_equal
    # Against plain data parallelism on the same 2 ranks: one addition per value, in the same
    # order whatever the units, and Adam's update is elementwise: bit for bit.
    for name, w in ddp.weights.items():
        assert np.array_equal(result.weights[name], w), name
    # Against one process: two means of 16 instead of one of 32. The attention's keys get a
    # gradient that is zero in exact arithmetic along every direction softmax ignores (a shift
    # shared by all keys, e.g. the key bias), so rounding noise there is what Adam normalises:
    # the key rows may move by up to lr per step apart (measured: 5e-5); every other value, and
    # the function the weights compute, agree to float32 rounding (measured: 1.1e-6 relative
    # outside the keys, 7e-7 in the logits).
    reference = train_one_process(small_gpt, small_text, config)
    d = 32  # small_gpt's width: qkv holds rows [query | key | value]
    for name, w in reference.items():
        got = result.weights[name]
        if name.endswith("attn.qkv.weight") or name.endswith("attn.qkv.bias"):
            assert np.abs(got[d : 2 * d] - w[d : 2 * d]).max() <= config.lr * 3, name
            got, w = np.delete(got, np.s_[d : 2 * d], 0), np.delete(w, np.s_[d : 2 * d], 0)
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6, err_msg=name)  # as zero2 above
    x = small_text().tensors[0]
    logits = {}
    for label, weights in (("zero3", result.weights), ("one process", reference)):
        net = small_gpt()
        net.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})
        with torch.no_grad():
            logits[label] = net(x)
    torch.testing.assert_close(logits["zero3"], logits["one process"], rtol=1e-5, atol=1e-5)
    # The ledger: every rank holds 16 Psi / N bytes of model state (float32 Adam), within 5 %.
    psi = sum(p.numel() for p in small_gpt().parameters())
    want = formula_bytes(3, psi, 2)
    assert len(result.records) == 3 * 2  # 3 steps of 32 on each of 2 ranks
    for rec in result.records:
        held = sum(rec[k] for k in LEDGER_KEYS)
        assert abs(held - want) <= 0.05 * want, (rec["rank"], rec["step"], held, want)
