"""Lecture 13: A model as an operator graph: each operator's shapes, FLOPs and parameters (source 003).

The execution simulator (FlexFlow, source 003) never runs the model: it needs only, per operator,
what goes in and out (per-sample shapes), how much arithmetic it does and how many parameters it
holds. A model is described by plain data, a list of layer tuples, so this layer-1 module knows
no ``nn.Module``; :mod:`course_lib.training.operator_graphs` reads the kit's models into the same
description. Operators are listed in the order a forward pass runs them; each takes the previous
one's output, except a ``concat``, which also takes an earlier operator's (a U-Net's skip
connection): the graph is a chain with skips, a DAG.

Layer tuples: ``("conv2d", out_channels, kernel, padding, stride)``, ``("relu",)``,
``("maxpool", kernel, stride)``, ``("flatten",)``, ``("linear", out_features)``,
``("upconv", out_channels, kernel, stride)`` (a transposed convolution), ``("concat", j)`` (the
output of operator ``j`` and the previous one's, joined by channels, ``j``'s first), and
``("loss",)`` (cross-entropy over classes, or over every pixel's classes for an image).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "KINDS",
    "Operator",
    "OperatorGraph",
    "alexnet_layers",
    "build_graph",
]

KINDS = ("conv2d", "relu", "maxpool", "flatten", "linear", "upconv", "concat", "loss")
BYTES = 4  # float32 activations, gradients and parameters


@dataclass(frozen=True)
class Operator:
    """One operator: kind, per-sample input and output shapes, parameters, forward FLOPs per sample.

    ``attrs`` holds ``(kernel, padding, stride)`` for conv2d, maxpool and upconv, ``()``
    otherwise; ``inputs`` the operators whose outputs it reads (``()``: the previous one, or the
    graph's input for the first; a concat names two).
    """

    name: str
    kind: str
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    params: int
    flops: float
    attrs: tuple[int, ...] = ()
    inputs: tuple[int, ...] = ()

    @property
    def has_params(self) -> bool:
        """Return whether the operator holds weights (linear, conv2d)."""
        return self.params > 0

    def out_bytes(self, batch: int) -> int:
        """Return the bytes of the operator's output for ``batch`` samples (float32)."""
        return BYTES * batch * _prod(self.out_shape)


@dataclass(frozen=True)
class OperatorGraph:
    """A chain of operators run on a global ``batch`` of inputs of per-sample ``input_shape``."""

    name: str
    ops: tuple[Operator, ...]
    batch: int
    input_shape: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.ops)

    @property
    def params(self) -> int:
        """Return the parameters of the whole model."""
        return sum(op.params for op in self.ops)

    def producers(self, i: int) -> tuple[int, ...]:
        """Return the operators whose outputs operator ``i`` reads (-1: the graph's input)."""
        return self.ops[i].inputs or (i - 1,)

    def index(self, name: str) -> int:
        """Return the position of operator ``name``."""
        for i, op in enumerate(self.ops):
            if op.name == name:
                return i
        raise ValueError(f"no operator {name!r}; operators are {[op.name for op in self.ops]}")


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


def _window(size: int, kernel: int, padding: int, stride: int, what: str) -> int:
    out = (size + 2 * padding - kernel) // stride + 1
    if out < 1:
        raise ValueError(f"{what}: a {kernel}x{kernel} window does not fit a side of {size}")
    return out


def _next(kind: str, args: tuple, shape: tuple[int, ...], name: str) -> Operator:
    """Return the operator of one layer tuple applied to per-sample ``shape``."""
    if kind == "conv2d":
        if len(shape) != 3:
            raise ValueError(
                f"{name}: conv2d needs a (C, H, W) input, got {shape}; drop the flatten"
            )
        c_out, k, p, s = args
        (c, _, w), hh = shape, _window(shape[1], k, p, s, name)
        out = (c_out, hh, _window(w, k, p, s, name))
        params = c_out * c * k * k + c_out
        return Operator(name, kind, shape, out, params, 2.0 * c * k * k * _prod(out), (k, p, s))
    if kind == "upconv":
        if len(shape) != 3:
            raise ValueError(f"{name}: upconv needs a (C, H, W) input, got {shape}")
        c_out, k, s = args
        (c, h, w), out = shape, (c_out, (shape[1] - 1) * s + k, (shape[2] - 1) * s + k)
        # every input pixel meets the whole kernel once: 2 c_in c_out k^2 per input pixel
        return Operator(
            name,
            kind,
            shape,
            out,
            c * c_out * k * k + c_out,
            2.0 * c * c_out * k * k * h * w,
            (k, 0, s),
        )
    if kind == "maxpool":
        if len(shape) != 3:
            raise ValueError(f"{name}: maxpool needs a (C, H, W) input, got {shape}")
        k, s = (args + (args[0],))[:2]
        out = (shape[0], _window(shape[1], k, 0, s, name), _window(shape[2], k, 0, s, name))
        return Operator(name, kind, shape, out, 0, float(k * k * _prod(out)), (k, 0, s))
    if kind == "linear":
        if len(shape) != 1:
            raise ValueError(f"{name}: linear needs a flat input, got {shape}; add ('flatten',)")
        (n_in,), n_out = shape, args[0]
        return Operator(name, kind, shape, (n_out,), n_in * n_out + n_out, 2.0 * n_in * n_out)
    if kind == "relu":
        return Operator(name, kind, shape, shape, 0, float(_prod(shape)))
    if kind == "flatten":
        return Operator(name, kind, shape, (_prod(shape),), 0, 0.0)
    if kind == "loss":
        if len(shape) not in (1, 3):
            raise ValueError(
                f"{name}: the loss needs (classes,) or (classes, H, W) logits, got {shape}"
            )
        return Operator(name, kind, shape, (1,), 0, 3.0 * _prod(shape))  # softmax + log + pick
    raise ValueError(f"unknown layer kind {kind!r}; choose one of {KINDS}")


def _concat(name: str, ops: list[Operator], args: tuple) -> Operator:
    """Return the concat of operator ``args[0]``'s output and the last operator's, by channels."""
    (j,), i = args, len(ops)
    if not ops or not 0 <= j < i - 1:
        raise ValueError(f"{name}: ('concat', j) joins an earlier operator j < {i - 1}, got {j}")
    a, b = ops[j].out_shape, ops[-1].out_shape
    if len(a) != 3 or a[1:] != b[1:]:
        raise ValueError(f"{name}: cannot join {a} and {b} by channels: sizes must match")
    shape = (a[0] + b[0], *a[1:])
    return Operator(name, "concat", shape, shape, 0, 0.0, (), (j, i - 1))


def build_graph(
    name: str, input_shape: tuple[int, ...], layers: list[tuple], batch: int
) -> OperatorGraph:
    """Return the operator graph of ``layers`` (plain tuples, see the module) on a ``batch``."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    ops, shape, counts = [], tuple(input_shape), {}
    for layer in layers:
        kind, args = layer[0], tuple(layer[1:])
        counts[kind] = counts.get(kind, 0) + 1
        name = f"{kind}{counts[kind]}"
        if kind == "concat":
            op = _concat(name, ops, args)
        else:
            op = _next(kind, args, shape, name)
        ops.append(op)
        shape = op.out_shape
    if not ops or ops[-1].kind != "loss":
        raise ValueError(f"{name}: the last layer must be ('loss',), so a step has a backward pass")
    return OperatorGraph(name, tuple(ops), batch, tuple(input_shape))


def alexnet_layers(num_classes: int = 1000) -> list[tuple]:
    """Return the single-column AlexNet of Krizhevsky's "one weird trick" (2014), input 3x224x224.

    The variant torchvision ships (64, 192, 384, 256, 256 channels; 61 M parameters): five
    convolutions (2.3 M parameters, about 90 % of the arithmetic) and three dense layers (58.6 M).
    """
    return [
        ("conv2d", 64, 11, 2, 4),
        ("relu",),
        ("maxpool", 3, 2),
        ("conv2d", 192, 5, 2, 1),
        ("relu",),
        ("maxpool", 3, 2),
        ("conv2d", 384, 3, 1, 1),
        ("relu",),
        ("conv2d", 256, 3, 1, 1),
        ("relu",),
        ("conv2d", 256, 3, 1, 1),
        ("relu",),
        ("maxpool", 3, 2),
        ("flatten",),
        ("linear", 4096),
        ("relu",),
        ("linear", 4096),
        ("relu",),
        ("linear", num_classes),
        ("loss",),
    ]
