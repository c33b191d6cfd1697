"""Parallel training, one folder per seam, each named with a lecture's word.

- ``exchanges/`` (lectures 4-7): the ``GradientExchange`` seam and one module per method;
- ``data_parallel/`` (lecture 4): the runner, the engine side, accounting, timelines, references;
- ``asynchronous/`` (lecture 5): the asynchronous and stale-synchronous parameter server;
- ``model_parallel/`` (lecture 9): tensor parallelism and Krizhevsky's hybrid;
- ``pipeline_parallel/`` (lecture 10): schedules (naive, GPipe, 1F1B) and stages;
- ``sharded/`` (lecture 11): ZeRO stages 1-3 as exchanges, the memory ledger, the bytes auditor;
- ``large_batch/`` (lecture 12): the gradient noise scale measured from the allreduce;
- ``transformer/`` (lecture 14): TinyGPT split by heads, vocabulary and sequence; ring attention
  and Ulysses;
- ``strategy_runs`` (lecture 13): the execution simulator's strategies run and timed on the
  engines, built from the folders above, and ``strategy_weights``: the weights they train put
  back together beside one process's (two modules, so they sit beside the folders).

Import from the module that holds a name.
"""

__all__: list[str] = []
