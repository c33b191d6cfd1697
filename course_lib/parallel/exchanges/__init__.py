"""Lectures 4-7, the gradient exchange: the ``GradientExchange`` seam and one module per method.

Every data-parallel scheme plugs in here: ``base`` holds the seam (``attach`` / ``exchange`` /
``after_step``) and the naive, ring and built-in allreduces; ``parameter_server`` (source 000),
``buckets`` and ``bucket_choice`` (DDP-style buckets), ``ddp`` (PyTorch DDP on the kit's
communicator), ``compressed`` and ``compressed_ddp`` (lecture 7), ``local_sgd`` and ``gossip``
(lectures 5-6). ``registry`` maps names to classes, a convenience: an instance works as well.
"""

__all__: list[str] = []
