"""Lectures 1-2, sequential training: the models, the training loop and the from-scratch NumPy pieces.

- ``loop``: one training step, ``fit``, evaluation, time-to-accuracy (lecture 1);
- ``models``: the course's models (MLP, LeNet, the small CNN of source 001, the U-Net of source 000);
- ``scratch``: convolution, pooling and SGD written in NumPy (lecture 2, assignment A1);
- ``lr_schedules``, ``batch_schedules``, ``layerwise``: learning-rate warm-up with linear scaling,
  batch ramp-up, LARS and LAMB (lecture 12, large batches);
- ``operator_graphs``: the kit's models as operator graphs for the strategy simulator (lecture 13).
"""

__all__: list[str] = []
