"""No lecture (the grader). The graded assignments, one folder each (``a1`` ... ``a8``): ``checks`` (the notebook's check cells and their judges), ``probe`` (how the grader probes the sandboxed kernel and judges what it returns) and the helpers they share.

Adding an assignment is one folder here with a ``probe`` module defining ``aN_spec`` (found by
:mod:`course_grader.registry`), its notebook in ``assignments/source`` and its tests.
"""

__all__: list[str] = []
