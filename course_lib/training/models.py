"""The course's models for every lecture, their shapes and sizes.

=================  ====================  =============================  ==========
model              input                 output                         parameters
=================  ====================  =============================  ==========
``MLP()``          (N, 1, 8, 8) digits   (N, 10) logits                 9 610
``LeNet()``        (N, 1, 8, 8) digits   (N, 10) logits                 19 754
``LeNet(28)``      (N, 1, 28, 28) MNIST  (N, 10) logits                 106 154
``SmallCNN()``     (N, 3, 32, 32) CIFAR  (N, 10) logits                 545 098
``SmallCNN(100)``  (N, 3, 32, 32) CIFAR  (N, 100) logits                556 708
``UNet()``         (N, 3, H, W), H, W    (N, 6, H, W) per-pixel logits  120 870
                   divisible by 8
``TinyGPT()``      (N, T) characters,    (N, 96, T) next-character      2 718 816
                   T <= 64               logits
=================  ====================  =============================  ==========

No model uses batch normalisation: its running statistics are buffers, not parameters, and with
data parallelism every replica would see different batch statistics, so a distributed run could
not equal the single-process one that later lectures compare against.
"""

from __future__ import annotations

import torch
from torch import nn

from course_lib.training.transformer import TinyGPT

__all__ = [
    "MLP",
    "LeNet",
    "SmallCNN",
    "UNet",
    "TinyGPT",
    "KNOWN_MODELS",
    "build_model",
    "param_count",
    "param_bytes",
    "grad_bytes",
]


class MLP(nn.Sequential):
    """Multi-layer perceptron: flatten, then Linear + ReLU per hidden layer, then Linear.

    The forward pass of source 001: h_j = relu(sum_i w_ji x_i + b_j). The default fits digits
    (64 inputs); ``MLP(784, (128,))`` is the Keras example of source 002.
    """

    def __init__(
        self, in_features: int = 64, hidden: tuple[int, ...] = (128,), num_classes: int = 10
    ) -> None:
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        super().__init__(*layers)


class LeNet(nn.Sequential):
    """LeNet-sized CNN for 1-channel digits: two conv(3x3) + ReLU + max-pool(2) stages, 3 dense.

    ``image_size`` 8 (digits) or 28 (MNIST, Fashion-MNIST); any multiple of 4 works. Padding 1
    keeps the size through each convolution, so each pooling halves it: 8 -> 4 -> 2.
    """

    def __init__(self, image_size: int = 8, num_classes: int = 10, in_channels: int = 1) -> None:
        if image_size % 4:
            raise ValueError(f"image_size must be a multiple of 4 (8 or 28), got {image_size}")
        side = image_size // 4
        super().__init__(
            nn.Conv2d(in_channels, 6, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(16 * side * side, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )


class SmallCNN(nn.Sequential):
    """Small CNN for CIFAR (3x32x32) after source 001: 10 or 100 classes, only the last layer differs.

    Source 001 gives its model only as a figure (Fig. 8, not in the text we have); this is a
    stand-in of the same kind: two conv(3x3)+ReLU+max-pool stages (32 and 64 channels), a dense
    layer of 128 and the output layer. It has about half a million parameters (2.2 MB of
    float32 gradients per step), small enough to train on CPUs as source 001 did.
    """

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 32 x 16 x 16
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 64 x 8 x 8
            nn.Flatten(),
            nn.Linear(64 * 8 * 8, 128),
            nn.ReLU(),
            nn.Linear(128, num_classes),
        )


def _double_conv(c_in: int, c_out: int) -> nn.Sequential:
    """Return two 3x3 convolutions with ReLU, padding 1 (the U-Net block, same size out)."""
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(c_out, c_out, 3, padding=1),
        nn.ReLU(),
    )


class UNet(nn.Module):
    """Small U-Net (Ronneberger et al. 2015) for per-pixel classes, as trained in source 000.

    ``depth`` poolings; level i has ``base_width * 2**i`` channels. Each decoder level upsamples
    with a 2x2 transposed convolution, concatenates the encoder's map of the same size (the skip
    connection) and applies a double convolution. The default (width 8, depth 3, 120 870
    parameters) trains on a CPU within a lecture; ``UNet(base_width=16, depth=4)`` has 1.94 M
    parameters (7.8 MB of float32 gradients), close to source 000's 8.74 MB network.
    """

    def __init__(
        self, in_channels: int = 3, num_classes: int = 6, base_width: int = 8, depth: int = 3
    ) -> None:
        super().__init__()
        if base_width < 1 or depth < 1:
            raise ValueError(f"base_width and depth must be >= 1, got {base_width}, {depth}")
        self.depth = depth
        widths = [base_width * 2**i for i in range(depth + 1)]
        self.down = nn.ModuleList([_double_conv(in_channels, widths[0])])
        self.down.extend(_double_conv(widths[i], widths[i + 1]) for i in range(depth))
        self.pool = nn.MaxPool2d(2)
        self.up = nn.ModuleList(
            nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2)
            for i in reversed(range(depth))
        )
        self.merge = nn.ModuleList(
            _double_conv(2 * widths[i], widths[i]) for i in reversed(range(depth))
        )
        self.head = nn.Conv2d(widths[0], num_classes, 1)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Return per-pixel logits (N, num_classes, H, W) for images X (N, C, H, W)."""
        factor = 2**self.depth
        if X.shape[-2] % factor or X.shape[-1] % factor:
            raise ValueError(
                f"U-Net of depth {self.depth} needs height and width divisible by {factor}, "
                f"got {tuple(X.shape[-2:])}; crop or pad the tiles"
            )
        skips = []
        h = X
        for i, block in enumerate(self.down):
            h = block(h if i == 0 else self.pool(h))
            skips.append(h)
        skips.pop()  # the bottom level feeds the decoder directly
        for up, merge in zip(self.up, self.merge, strict=True):
            h = merge(torch.cat([skips.pop(), up(h)], dim=1))
        return self.head(h)


KNOWN_MODELS = {
    "mlp": MLP,
    "lenet": LeNet,
    "small_cnn": SmallCNN,
    "unet": UNet,
    "tiny_gpt": TinyGPT,  # course_lib.training.transformer
}


def build_model(name: str, **kwargs) -> nn.Module:
    """Build model ``name`` (one of ``KNOWN_MODELS``) with keyword arguments for its class."""
    try:
        cls = KNOWN_MODELS[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; known models: {', '.join(KNOWN_MODELS)}"
        ) from None
    return cls(**kwargs)


def param_count(net: nn.Module, *, trainable_only: bool = True) -> int:
    """Return the number of (trainable) parameters of ``net``."""
    return sum(p.numel() for p in net.parameters() if p.requires_grad or not trainable_only)


def param_bytes(net: nn.Module) -> int:
    """Return the bytes of all parameters of ``net`` (what a parameter server sends out)."""
    return sum(p.numel() * p.element_size() for p in net.parameters())


def grad_bytes(net: nn.Module) -> int:
    """Return the bytes of one full gradient of ``net`` (what data parallelism sends per step).

    One gradient entry per trainable parameter, in the parameter's dtype (source 000: 8.33 MB
    of float32 gradients for its U-Net).
    """
    return sum(p.numel() * p.element_size() for p in net.parameters() if p.requires_grad)
