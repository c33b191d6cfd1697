"""A9: ring attention's forward with online softmax: its checks (``checks``: the notebook's check cells), the grader's probe (``probe``) and their helpers.

Nothing is imported here: a sandboxed kernel may be shown one helper of this folder and no other.
"""

__all__: list[str] = []
