"""No lecture (the course in a second language): gettext catalogues of the notebooks' prose, and the Russian notebooks built from them.

:mod:`~course_kit.i18n.catalogue` keeps one ``.po`` file per English notebook under
``locale/<lang>/notebooks/`` (one message per markdown cell, keyed by the cell's id) and builds the
translated notebooks from the English ones, code cells copied unchanged.
"""

__all__: list[str] = []
