"""Lecture 12, large batches: what changes when more ranks make the global batch larger.

- ``noise_scale``: the gradient noise scale $B_{noise}$ (McCandlish et al. 2018), measured for
  free from the allreduce a data-parallel step already does, and its one-process reference.
- ``critical_batch``: steps to a target against batch size (Shallue et al. 2019), the learning
  rate tuned per batch, and the fitted bend $B_{crit}$.

The learning-rate schedule (linear scaling with warm-up, ``training/lr_schedules.py``), the
batch ramp-up (``training/batch_schedules.py``) and LARS / LAMB (``training/layerwise.py``) live
with the training loop, which every rank runs; ``TrainConfig`` names them.
"""

__all__: list[str] = []
