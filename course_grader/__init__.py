"""No lecture (the grader). Graded assignments: release student notebooks from their sources, grade them with nbval in a sandbox, decide every verdict in the grader's own process.

One folder per assignment (``assignments/aN``: its checks, its probe and their helpers), found by
:mod:`course_grader.registry`; the pipeline (``release``, ``grade``, ``gradebook``, ``runner``,
``cells``); the verdict out of the answer's reach (``verdict``); the sandbox (``sandbox``); the
grader testing itself (``selftest``); ``python -m course_grader release | grade | check | selftest``.

Nothing is imported here: a sandboxed kernel may be shown one helper of an assignment's folder
(A3's engine-side collector) and must import it without the rest of the grader.
"""

__all__: list[str] = []
