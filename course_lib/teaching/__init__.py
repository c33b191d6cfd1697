"""Every lecture: the teaching aids a lecturer uses in class: predict-then-measure boxes and the end-of-lecture questions.

:mod:`~course_lib.teaching.predict` (the prediction box), :mod:`~course_lib.teaching.questions`
(question types and their checker), :mod:`~course_lib.teaching.bank` (each lecture's questions),
:mod:`~course_lib.teaching.quiz_export` (Markdown and Moodle XML for the lecturer).
"""
