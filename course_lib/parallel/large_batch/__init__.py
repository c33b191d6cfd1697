"""Lecture 12, large batches: what changes when more ranks make the global batch larger.

- ``noise_scale``: the gradient noise scale $B_{noise}$ (McCandlish et al. 2018), measured for
  free from the allreduce a data-parallel step already does, and its one-process reference.

The learning-rate schedule (linear scaling with warm-up) and the LARS / LAMB optimisers live
with the training loop, in :mod:`course_lib.training.loop`, which every rank runs.
"""

__all__: list[str] = []
