"""Lecture 13: The kit's models as operator graphs, for the execution simulator.

:mod:`course_lib.cost_model.operators` describes a model by plain layer tuples (it sits below
``training`` and knows no ``nn.Module``); this module reads a Sequential model of
:mod:`course_lib.training.models` (``MLP``, ``LeNet``, ``SmallCNN``) into those tuples, so the
simulator sees exactly the layers the engines train. The U-Net is not a chain: :func:`unet_layers`
lists its operators in the order its forward runs them, each skip connection a ``concat`` of an
encoder level's output with the upsampled map (source 000's segmentation network).
"""

from __future__ import annotations

from torch import nn

from course_lib.cost_model.operators import OperatorGraph, build_graph
from course_lib.training.models import MLP, LeNet, SmallCNN, UNet

__all__ = ["graph_of", "kit_graph", "layers_of", "unet_layers"]


def _pair(v) -> int:
    """Return one side of a square kernel, padding or stride (int or equal pair)."""
    if isinstance(v, tuple):
        if len(set(v)) != 1:
            raise ValueError(f"only square kernels, paddings and strides are modelled, got {v}")
        return v[0]
    return v


def unet_layers(net: UNet) -> list[tuple]:
    """Return the layer tuples of a kit ``UNet`` in forward order, ending with a per-pixel loss."""
    out, skips = [], []
    for i, block in enumerate(net.down):
        if i:
            out += _modules([net.pool])
        out += _modules(block)
        skips.append(len(out) - 1)  # the level's output: the skip connection's source
    skips.pop()  # the bottom level feeds the decoder directly
    for up, merge in zip(net.up, net.merge, strict=True):
        out.append(("upconv", up.out_channels, _pair(up.kernel_size), _pair(up.stride)))
        out.append(("concat", skips.pop()))  # torch.cat([skip, up(h)]): the skip's channels first
        out += _modules(merge)
    return out + _modules([net.head]) + [("loss",)]


def layers_of(net: nn.Module) -> list[tuple]:
    """Return the layer tuples of a Sequential ``net`` (or a kit ``UNet``), ending with the loss."""
    if isinstance(net, UNet):
        return unet_layers(net)
    if not isinstance(net, nn.Sequential):
        raise ValueError(
            f"{type(net).__name__} is not a chain of layers (nn.Sequential); the "
            "simulator reads chains and the kit's UNet: use MLP, LeNet, SmallCNN or UNet"
        )
    return _modules(net) + [("loss",)]


def _modules(modules) -> list[tuple]:
    """Return the layer tuples of a sequence of modules (no loss)."""
    out = []
    for m in modules:
        if isinstance(m, nn.Conv2d):
            out.append(
                ("conv2d", m.out_channels, _pair(m.kernel_size), _pair(m.padding), _pair(m.stride))
            )
        elif isinstance(m, nn.Linear):
            out.append(("linear", m.out_features))
        elif isinstance(m, nn.ReLU):
            out.append(("relu",))
        elif isinstance(m, nn.MaxPool2d):
            out.append(("maxpool", _pair(m.kernel_size), _pair(m.stride or m.kernel_size)))
        elif isinstance(m, nn.Flatten):
            out.append(("flatten",))
        else:
            raise ValueError(
                f"no operator for {type(m).__name__}; the simulator knows Conv2d, "
                "Linear, ReLU, MaxPool2d and Flatten"
            )
    return out


def graph_of(
    net: nn.Module, input_shape: tuple[int, ...], batch: int, name: str = ""
) -> OperatorGraph:
    """Return the operator graph of ``net`` on a ``batch`` of per-sample ``input_shape`` inputs."""
    return build_graph(name or type(net).__name__, tuple(input_shape), layers_of(net), batch)


def kit_graph(name: str, batch: int) -> OperatorGraph:
    """Return the graph of a kit model by name: ``mlp``, ``lenet`` (digits), ``small_cnn`` or
    ``unet`` (64 x 64 tiles, the generated segmentation set's)."""
    models = {
        "mlp": (MLP, (1, 8, 8)),
        "lenet": (LeNet, (1, 8, 8)),
        "small_cnn": (SmallCNN, (3, 32, 32)),
        "unet": (UNet, (3, 64, 64)),
    }
    if name not in models:
        raise ValueError(f"no graph for {name!r}; choose one of {sorted(models)}")
    cls, shape = models[name]
    return graph_of(cls(), shape, batch, name)
