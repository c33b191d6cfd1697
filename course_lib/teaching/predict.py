"""Every lecture: predict, then measure. A prediction box locks a measurement until the student has typed a guess.

Before a key measurement the notebook shows :class:`Prediction` (a number box, or options to
pick from, and a "Lock in" button); after it, ``p.reveal(measured, formula_value)`` shows the
measurement and the formula beside it once a prediction is locked in, and records how far off
it was (in ``.predictions.json`` beside the notebook, written atomically). The idea follows
Harvard's MLSysBook labs, which keep a chart hidden until the student commits to a number.

Under the test command, ``jupyter nbconvert --execute`` or any kernel that no Jupyter server
started (no ``JPY_SESSION_NAME`` in its environment), or with ``COURSE_NONINTERACTIVE=1``, the
lock is skipped: the reveal prints the measurement at once and says that no prediction was asked.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from course_lib.files import atomic_write_text
from course_lib.i18n import _

__all__ = ["RECORD_FILE", "Prediction", "Shown", "interactive", "off_by"]

#: Where the predictions of a notebook's folder are kept (one JSON object, key = prediction id).
RECORD_FILE = ".predictions.json"


def interactive() -> bool:
    """Return True when a person may be typing: a Jupyter server started this kernel."""
    if os.environ.get("COURSE_NONINTERACTIVE", "") not in ("", "0"):
        return False
    return bool(os.environ.get("JPY_SESSION_NAME") or os.environ.get("COURSE_INTERACTIVE"))


def off_by(predicted: float | str, measured: float | str) -> str:
    """Return how far a prediction was from the measurement, in words (a ratio for numbers)."""
    if isinstance(predicted, str) or isinstance(measured, str):
        return "right" if predicted == measured else f"you picked {predicted!r}"
    if measured == 0 or predicted == 0:
        return f"off by {abs(predicted - measured):.3g}"
    ratio = predicted / measured
    if ratio <= 0:
        return "wrong sign"
    factor = max(ratio, 1 / ratio)
    if factor < 1.1:
        return f"within 10 % (× {ratio:.2f})"
    side = "too high" if ratio > 1 else "too low"
    return f"{side} by a factor {factor:.2g} (log10 error {abs(math.log10(ratio)):.2f})"


class Shown(str):
    """Text already printed by a cell; as the cell's last value it shows nothing more."""

    def _ipython_display_(self) -> None:
        """Show nothing: the text was printed already."""


@dataclass
class Prediction:
    """A question whose answer the next cell measures; ``options`` make it a pick, else a number.

    ``formula`` is the model the lecture derives (LaTeX or words); ``reveal`` shows its value
    beside the measurement. ``folder`` is where ``.predictions.json`` goes (default: the
    notebook's working directory).
    """

    pid: str
    question: str
    unit: str = ""
    formula: str = ""
    options: tuple[str, ...] = ()
    folder: str | os.PathLike | None = None
    predicted: float | str | None = None
    measured: float | str | None = None
    formula_value: float | str | None = None
    _out: object = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.pid or not self.question:
            raise ValueError(
                "a Prediction needs an id and a question, e.g. Prediction('3.a', '...')"
            )
        self.options = tuple(self.options)

    # ---- the box ------------------------------------------------------------------------------
    def _ipython_display_(self) -> None:
        from IPython.display import Markdown, display

        display(
            Markdown(_("**Predict first ({pid}).**").format(pid=self.pid) + f" {self.question}")
        )
        if not interactive():
            print(_("(non-interactive run: the prediction box is shown only in JupyterLab)"))
            return
        import ipywidgets as widgets

        box = (
            widgets.Dropdown(options=["(choose)", *self.options], description="I predict")
            if self.options
            else widgets.FloatText(description=f"I predict ({self.unit})" if self.unit else "")
        )
        button = widgets.Button(description="Lock in", button_style="primary")
        self._out = widgets.Output()

        def lock(_button):
            value = box.value
            if self.options and value == "(choose)":
                return
            self.submit(value)

        button.on_click(lock)
        display(widgets.HBox([box, button]), self._out)

    def submit(self, value: float | str) -> str:
        """Lock in a prediction; once the measurement is known, show and record how far off it was."""
        if self.options and value not in self.options:
            raise ValueError(f"pick one of {list(self.options)}, got {value!r}")
        self.predicted = value if self.options else float(value)
        return self._show()

    # ---- the reveal ---------------------------------------------------------------------------
    def reveal(self, measured: float | str, formula_value: float | str | None = None) -> str:
        """Give the measurement (and the formula's value); show both once a prediction is locked.

        Returns the text shown (or that would be shown): the lock is skipped, and says so, in
        non-interactive runs.
        """
        self.measured, self.formula_value = measured, formula_value
        if self.predicted is None and interactive():
            text = _(
                "{pid}: locked: type your prediction in the box above and press Lock in; "
                "the measurement appears under the box"
            ).format(pid=self.pid)
            self._print(text, here=True)
            return Shown(text)
        return self._show(here=True)

    def _show(self, here: bool = False) -> str:
        if self.measured is None:
            text = _("{pid}: prediction {value} locked in; run the measurement").format(
                pid=self.pid, value=self._fmt(self.predicted)
            )
            self._print(text, here)
            return Shown(text)
        lines = [_("{pid}: measured {value}").format(pid=self.pid, value=self._fmt(self.measured))]
        if self.formula:
            value = "" if self.formula_value is None else f" = {self._fmt(self.formula_value)}"
            lines.append(_("  formula: {formula}").format(formula=self.formula) + value)
        if self.predicted is None:
            lines.append(_("  (non-interactive run: no prediction was asked; the lock is skipped)"))
        else:
            how = off_by(self.predicted, self.measured)
            lines.append(
                _("  your prediction {value}: {how}").format(
                    value=self._fmt(self.predicted), how=how
                )
            )
            self._record(how)
        text = "\n".join(lines)
        self._print(text, here)
        return Shown(text)

    def _fmt(self, value: float | str | None) -> str:
        if isinstance(value, str) or value is None:
            return str(value)
        return f"{value:.4g} {self.unit}".rstrip()

    def _print(self, text: str, here: bool) -> None:
        """Print in the running cell (``here``) and, in JupyterLab, under the prediction box."""
        if self._out is not None and interactive():
            self._out.clear_output()
            with self._out:
                print(text)
        if here or self._out is None:
            print(text)

    def _record(self, how: str) -> None:
        path = Path(self.folder or ".") / RECORD_FILE
        try:
            records = json.loads(path.read_text()) if path.exists() else {}
        except (OSError, ValueError):
            records = {}  # a damaged record file is replaced, never a reason to stop the lecture
        records[self.pid] = {
            "predicted": self.predicted,
            "measured": self.measured,
            "formula_value": self.formula_value,
            "off_by": how,
        }
        atomic_write_text(path, json.dumps(records, indent=1, default=str))
