"""No lecture (the grader). Graded assignments: release student notebooks from sources, grade them with nbval in a sandbox."""

from course_lib.grading.cells import answer_id, check_id, stub_solution
from course_lib.grading.grade import (
    ExerciseResult,
    GradingLimits,
    build_graded_notebook,
    grade_notebook,
)
from course_lib.grading.gradebook import grade_folder, write_feedback, write_gradebook
from course_lib.grading.release import release_all, release_notebook
from course_lib.grading.sandbox import SandboxLimits, sandbox_problem

__all__ = [
    "ExerciseResult",
    "GradingLimits",
    "SandboxLimits",
    "answer_id",
    "build_graded_notebook",
    "check_id",
    "grade_folder",
    "grade_notebook",
    "release_all",
    "release_notebook",
    "sandbox_problem",
    "stub_solution",
    "write_feedback",
    "write_gradebook",
]
