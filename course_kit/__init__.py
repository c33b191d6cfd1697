"""No lecture (the lab). The machinery around the notebooks, the instructor's side: the lab's PCs (``lab``), the emulated room (``room``), the network doctor (``network``) and every ``./kit`` job (``jobs``; ``python -m course_kit JOB`` without bash).

Imports the teaching library (``course_lib``) and the grader (``course_grader``); neither imports it.
"""

__all__: list[str] = []
