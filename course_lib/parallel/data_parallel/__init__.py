"""Lecture 4, data parallelism: the runner that trains one replica per engine through an exchange.

``train`` (``train_data_parallel``, the notebook side), ``engines`` (start-up and checks on the
engines), ``replica`` (the engine side), ``accounting`` and ``timeline`` (where a step's time and
bytes go), ``prediction`` (a step's time from the alpha-beta model), ``stragglers``,
``checkpointing``, and the one-process references (``reference``,
``reference_local_sgd``) that every distributed run is tested against.
"""

__all__: list[str] = []
