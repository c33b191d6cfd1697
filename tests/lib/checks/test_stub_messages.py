"""The lecture stubs that used to spell out their answer (4.1, 4.2, 6.1, 6.2, 8.1, 8.2) now say only
what to write: each raises NotImplementedError, and its message holds none of the answer's steps.
(Each check failing its stub is tested beside the check, in test_checks_lectureNN.py.)"""

from __future__ import annotations

import inspect

import pytest
from lecture_notebooks import notebook_function

STUBS = [  # (notebook, function, what the old messages gave away)
    ("04_data_parallel.ipynb", "my_ps_average",
     ("send", "recv", "rank 0", "divide", "adds", "mean back")),
    ("04_data_parallel.ipynb", "my_sync_time", ("busiest", "alpha +", "bytes *", "messages")),
    ("06_topologies.ipynb", "my_gossip_matrix", ("1/3", "gossip_partners", "row i")),
    ("06_topologies.ipynb", "my_spectral_gap", ("singular", "W - J", "1 minus", "norm")),
    ("08_reproducing_the_papers.ipynb", "my_values_sent", ("steps // period", "averagings")),
    ("08_reproducing_the_papers.ipynb", "my_regime_rate", ("solve", "t_s", "f =", "over")),
]  # fmt: skip


@pytest.mark.parametrize(("notebook", "name", "answer"), STUBS, ids=[s[1] for s in STUBS])
def test_a_stub_raises_and_its_message_does_not_state_the_answer(notebook, name, answer):
    stub = notebook_function(notebook, name)
    args = [None] * len(inspect.signature(stub).parameters)
    with pytest.raises(NotImplementedError) as raised:
        stub(*args)
    message = str(raised.value)
    assert message.startswith("Exercise "), message
    for step in answer:
        assert step not in message, (step, message)
