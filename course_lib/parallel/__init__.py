"""Layer 3, parallel training: data parallelism (parameter server, allreduce exchanges, buckets,
the DDP bridge), synchronisation schemes, model (tensor) and pipeline parallelism.

Each idea is one module; import from the module that holds it.
"""

__all__: list[str] = []
