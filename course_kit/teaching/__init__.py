"""No lecture (the lecturer's documents): the syllabus's hours, the notes per lecture, the quiz files, the notebooks' teaching cells.

:mod:`~course_kit.teaching.measure` (what each notebook takes), :mod:`~course_kit.teaching.mistakes`
(the mistakes the checks name), :mod:`~course_kit.teaching.generate` (the generated parts of
``docs/teaching/``), :mod:`~course_kit.teaching.quiz` (the quiz files), and
:mod:`~course_kit.teaching.annotate` (slide tags, prediction boxes and question cells added to a
notebook by script).
"""
