"""Tests of course_lib.training.models: documented shapes and parameter counts, sizes in bytes."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn

from course_lib.training.models import (
    MLP,
    LeNet,
    SmallCNN,
    UNet,
    build_model,
    grad_bytes,
    param_bytes,
    param_count,
)

# (model, input shape, output shape, parameter count) — the table in models.py's docstring.
DOCUMENTED = [
    (lambda: MLP(), (2, 1, 8, 8), (2, 10), 9_610),
    (lambda: LeNet(), (2, 1, 8, 8), (2, 10), 19_754),
    (lambda: LeNet(28), (2, 1, 28, 28), (2, 10), 106_154),
    (lambda: SmallCNN(), (2, 3, 32, 32), (2, 10), 545_098),
    (lambda: SmallCNN(100), (2, 3, 32, 32), (2, 100), 556_708),
    (lambda: UNet(), (2, 3, 32, 48), (2, 6, 32, 48), 120_870),
]


@pytest.mark.parametrize(("make", "in_shape", "out_shape", "count"), DOCUMENTED)
def test_documented_shapes_and_parameter_counts(make, in_shape, out_shape, count):
    net = make()
    assert net(torch.zeros(in_shape)).shape == out_shape
    assert param_count(net) == count
    assert (
        f"{count:,}".replace(",", " ")
        in importlib.import_module("course_lib.training.models").__doc__
    )


def test_mlp_by_hand():
    # 64*128 + 128 + 128*10 + 10, counted by hand.
    assert param_count(MLP()) == 64 * 128 + 128 + 128 * 10 + 10
    assert param_count(MLP(784, (128,))) == 101_770  # source 002's Keras MLP summary


def test_unet_close_to_source_000_size():
    # Source 000: 8.74 MB network, 8.33 MB of gradients; width 16, depth 4 is our near match.
    assert 7.0e6 < grad_bytes(UNet(base_width=16, depth=4)) < 9.0e6


def test_unet_width_scales_parameters_about_quadratically():
    small, wide = param_count(UNet(base_width=8)), param_count(UNet(base_width=16))
    assert 3.5 < wide / small < 4.1


def test_unet_rejects_sizes_it_cannot_pool():
    with pytest.raises(ValueError, match="divisible by 8"):
        UNet()(torch.zeros(1, 3, 30, 32))
    with pytest.raises(ValueError):
        UNet(base_width=0)


def test_lenet_rejects_odd_image_size():
    with pytest.raises(ValueError, match="multiple of 4"):
        LeNet(image_size=10)


def test_byte_sizes_follow_dtype_and_frozen_parameters():
    net = MLP()
    assert param_bytes(net) == grad_bytes(net) == 4 * param_count(net)
    net[1].weight.requires_grad_(False)  # a frozen layer sends no gradient
    assert grad_bytes(net) == 4 * (param_count(net))
    assert param_count(net) == 9_610 - 64 * 128
    assert param_count(net, trainable_only=False) == 9_610
    assert grad_bytes(MLP().to(torch.float16)) == 2 * 9_610


def test_build_model_and_unknown_name():
    assert isinstance(build_model("unet", base_width=4), UNet)
    assert isinstance(build_model("LeNet", image_size=28), nn.Module)
    with pytest.raises(ValueError, match="mlp, lenet, small_cnn, unet"):
        build_model("resnet50")


def test_models_have_no_batch_norm():
    for make, *_ in DOCUMENTED:
        assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in make().modules())
