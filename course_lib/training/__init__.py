"""Lectures 1-2, sequential training: the models, the training loop and the from-scratch NumPy pieces.

- ``loop``: one training step, ``fit``, evaluation, time-to-accuracy (lecture 1);
- ``models``: the course's models (MLP, LeNet, the small CNN of source 001, the U-Net of source 000);
- ``scratch``: convolution, pooling and SGD written in NumPy (lecture 2, assignment A1).
"""

__all__: list[str] = []
