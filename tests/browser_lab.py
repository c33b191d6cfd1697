"""JupyterLab started as ``./kit lab`` starts it, driven in headless Chromium through Playwright.

Used by ``tests/kit/room/test_browser.py`` and by ``bench/browser_walkthrough.py``. Only JupyterLab's own
menus and keys drive the notebook; the page is read through its DOM, as a student would see it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from course_kit.jobs.lab import LOCALES

__all__ = [
    "JupyterLabServer",
    "NotebookPage",
    "browser_skip_reason",
    "find_chromium",
    "open_browser",
    "tracebacks",
]

REPO = Path(__file__).resolve().parent.parent
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# Settings a fresh JupyterLab gets in its own settings folder. Autosave off: running a lecture in
# the test must not rewrite the stored notebook. Windowing off: every cell stays in the DOM, so the
# page can be read in one go (a student's Lab attaches off-screen cells lazily; same cells).
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}


def find_chromium() -> str | None:
    """Return a Chromium (or Chrome) executable: ``COURSE_CHROMIUM`` or the first on PATH."""
    explicit = os.environ.get("COURSE_CHROMIUM")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def browser_skip_reason() -> str | None:
    """Return why the browser tests cannot run here, or None when they can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed: pip install playwright (the kit's [dev] extra)"
    if find_chromium() is None:
        return (
            "no Chromium found (looked for COURSE_CHROMIUM, "
            + ", ".join(CHROMIUM_NAMES)
            + "): install Debian's `chromium` package (apt-get install chromium)"
        )
    return None


def open_browser(playwright: Any) -> Any:
    """Launch the machine's Chromium headless (Playwright's own browser download is not used)."""
    return playwright.chromium.launch(executable_path=find_chromium(), headless=True)


def _descendants(pid: int) -> list[Any]:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


class JupyterLabServer:
    """``jupyter lab --notebook-dir=notebooks`` on a free loopback port with a token; a context."""

    def __init__(
        self,
        notebook_dir: Path = REPO / "notebooks",
        start_timeout: float = 300.0,
        env: dict[str, str] | None = None,
        lang: str | None = None,
    ):
        self.notebook_dir = Path(notebook_dir)
        self.env = env  # the server's (and so its kernels') environment; None: this process's
        self.lang = lang  # as ./kit lab --lang: the interface's locale and the kit's messages
        self.start_timeout = start_timeout
        self.token = secrets.token_hex(16)
        self.url = ""
        self.leftovers: list[str] = []  # processes that outlived a clean shutdown (then killed)
        self._tmp = Path(tempfile.mkdtemp(prefix="course-lab-"))
        self._proc: subprocess.Popen | None = None
        self._seen: dict[int, Any] = {}  # every descendant seen while running, by pid

    def __enter__(self) -> JupyterLabServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def log(self) -> str:
        """Return the server's log so far (for an assertion message)."""
        path = self._tmp / "lab.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self) -> None:
        """Start the server the way ``./kit lab`` does and wait until it has written its URL."""
        settings_dir = self._tmp / "settings"
        settings = dict(LAB_SETTINGS)
        if self.lang is not None:
            settings["@jupyterlab/translation-extension/plugin"] = {"locale": LOCALES[self.lang][0]}
        for plugin, values in settings.items():
            path = settings_dir / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        env = dict(
            os.environ if self.env is None else self.env,
            JUPYTER_RUNTIME_DIR=str(self._tmp / "runtime"),
            JUPYTERLAB_SETTINGS_DIR=str(settings_dir),
            JUPYTERLAB_WORKSPACES_DIR=str(self._tmp / "workspaces"),
        )
        if self.lang is not None:
            env["COURSE_LANG"] = self.lang  # kernels inherit it, as under ./kit lab --lang
        jupyter = Path(sys.executable).with_name("jupyter")
        cmd = [str(jupyter)] if jupyter.exists() else [sys.executable, "-m", "jupyter"]
        cmd += ["lab", f"--notebook-dir={self.notebook_dir}"]
        if os.name == "posix" and os.geteuid() == 0:
            cmd.append("--allow-root")  # as ./kit lab adds it
        cmd += [
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            "--ServerApp.port=0",  # the OS picks a free port; the runtime file says which
            f"--IdentityProvider.token={self.token}",
        ]
        log = open(self._tmp / "lab.log", "w")  # noqa: SIM115 - closed with the process
        self._proc = subprocess.Popen(
            cmd, cwd=self.notebook_dir.parent, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + self.start_timeout
        info_file = self._tmp / "runtime" / f"jpserver-{self._proc.pid}.json"
        while not info_file.exists():
            if self._proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self._proc.returncode}:\n{self.log}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"jupyter lab wrote no URL within {self.start_timeout:.0f} s")
            time.sleep(0.2)
        time.sleep(0.2)  # the file is written in one go, but give the writer a moment
        self.url = json.loads(info_file.read_text())["url"]

    def page_url(self, path: str) -> str:
        """Return the address that opens ``path`` (relative to the notebook folder) alone in Lab.

        ``reset`` drops the saved workspace, which would reopen the notebooks of earlier pages.
        """
        return f"{self.url}lab/tree/{path}?reset&token={self.token}"

    def remember_processes(self) -> None:
        """Note the server's descendants now (kernels, engines, mpiexec) for :meth:`stop`."""
        if self._proc is not None:
            for proc in _descendants(self._proc.pid):
                self._seen.setdefault(proc.pid, proc)

    def stop(self, grace: float = 60.0) -> None:
        """Shut the server down through its API, then end whatever of its processes outlived it."""
        import psutil

        if self._proc is None:
            return
        self.remember_processes()
        if self._proc.poll() is None:
            try:
                request = urllib.request.Request(
                    f"{self.url}api/shutdown",
                    method="POST",
                    headers={"Authorization": f"token {self.token}"},
                )
                urllib.request.urlopen(request, timeout=30).close()
            except OSError:
                self._proc.terminate()
            try:
                self._proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=30)
        # Kernels stop their clusters at exit; give them the same grace, then end the rest.
        alive = [p for p in self._seen.values() if p.is_running()]
        _, alive = psutil.wait_procs(alive, timeout=grace)
        for proc in alive:
            try:
                self.leftovers.append(" ".join(proc.cmdline())[:200] or proc.name())
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=30)
        self._proc = None
        shutil.rmtree(self._tmp, ignore_errors=True)


# The page, read through JupyterLab's DOM (JupyterLab 4).
_CELLS_JS = """
() => Array.from(document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell'))
  .map((cell) => {
    const outputs = Array.from(cell.querySelectorAll('.jp-OutputArea-output'));
    return {
      kind: cell.classList.contains('jp-CodeCell') ? 'code' : 'markdown',
      prompt: (cell.querySelector('.jp-InputArea-prompt') || {textContent: ''}).textContent.trim(),
      source: (cell.querySelector('.jp-InputArea-editor') || {innerText: ''}).innerText.slice(0, 80),
      stderr: outputs
        .filter((o) => o.getAttribute('data-mime-type') === 'application/vnd.jupyter.stderr')
        .map((o) => o.innerText),
      text: outputs.map((o) => o.innerText).join('\\n'),
      tables: cell.querySelectorAll('.jp-OutputArea-output table').length,
      progress: cell.querySelectorAll('.jp-OutputArea-output .jupyter-widgets .progress-bar').length,
      widgets: cell.querySelectorAll('.jp-OutputArea-output .jupyter-widgets').length,
      widgetErrors: outputs.filter((o) => o.innerText.includes('Error displaying widget')).length,
      images: Array.from(cell.querySelectorAll('.jp-OutputArea-output img'))
        .map((img) => [img.naturalWidth, img.naturalHeight, img.clientWidth]),
      outputHeight: (cell.querySelector('.jp-Cell-outputArea') || {scrollHeight: 0}).scrollHeight,
    };
  })
"""

# The kernel's state as the status bar shows it ("Python 3 (ipykernel) | Idle"), lower case, in
# English or in Russian (./kit lab --lang ru). The toolbar's circle says "idle" before a kernel
# exists; the status bar waits for the real one.
_STATUS_JS = """
() => {
  const item = document.querySelector('.jp-StatusBar-TextItem[title^="Change kernel for"], '
    + '.jp-StatusBar-TextItem[title^="Изменить ядро для"]');
  const text = item ? item.textContent : '';
  const state = text.includes('|') ? text.split('|').pop().trim().toLowerCase() : null;
  return state === 'простаивает' ? 'idle' : state;
}
"""

# Done: the kernel is idle, no cell is queued or running, and `first` has a number.
_DONE_JS = """
(first) => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  if (!panel || (STATUS)() !== 'idle') return false;
  const prompts = Array.from(panel.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt'))
    .map((p) => p.textContent.trim());
  if (prompts.some((p) => p.includes('*'))) return false;
  return /\\[\\d+\\]/.test(prompts[first] || '');
}
""".replace("STATUS", _STATUS_JS.strip())

TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\w*(Error|Exception)\b", re.M)


class NotebookPage:
    """One notebook open in JupyterLab, driven through its menus and keys."""

    def __init__(self, page: Any, lab: JupyterLabServer, labels: dict[str, str] | None = None):
        self.page = page
        self.lab = lab
        self.labels = labels or {}  # the menus' English labels -> the interface's language

    def open(self, path: str, timeout: float = 300.0) -> None:
        """Open ``path`` in Lab and wait until its kernel is idle."""
        self.page.goto(self.lab.page_url(path), timeout=timeout * 1000)
        self.page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=timeout * 1000)
        self.wait_idle(timeout)

    def wait_idle(self, timeout: float = 300.0) -> None:
        """Wait until the notebook's kernel reports idle."""
        try:
            self.page.wait_for_function(
                f"() => ({_STATUS_JS})() === 'idle'", timeout=timeout * 1000, polling=500
            )
        except Exception as exc:  # playwright's TimeoutError: say what the page and server show
            status = self.page.evaluate(_STATUS_JS)
            raise AssertionError(
                f"the kernel was not idle within {timeout:.0f} s (status {status!r}); "
                f"server log:\n{self.lab.log[-4000:]}"
            ) from exc

    def menu(self, top: str, item: str) -> None:
        """Click ``top`` in the menu bar, then ``item`` in its menu (as a student does)."""
        top, item = self.labels.get(top, top), self.labels.get(item, item)
        self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{top}$")).click()
        menu_item = self.page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{item}$"))
        menu_item.click()

    def clear_outputs(self) -> None:
        """Edit → Clear Outputs of All Cells: what is read afterwards comes from this run."""
        self.menu("Edit", "Clear Outputs of All Cells")
        self.page.wait_for_function(
            "() => !document.querySelector("
            "'.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output')",
            timeout=60_000,
        )

    def run_all(self, timeout: float = 600.0) -> list[dict]:
        """Run → Run All Cells, wait until every cell has run or the run stopped; return cells."""
        self.menu("Run", "Run All Cells")
        return self.wait_done(0, timeout)

    def run_cell(self, index: int, timeout: float = 300.0) -> list[dict]:
        """Click code cell ``index`` (0-based among code cells), Shift+Enter, wait; return cells."""
        prompt = self.page.locator(
            ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputArea-prompt"
        ).nth(index)
        prompt.click()
        self.page.keyboard.press("Shift+Enter")
        return self.wait_done(index, timeout)

    def wait_done(self, first: int, timeout: float) -> list[dict]:
        """Wait until code cell ``first`` has a number and nothing is queued; return cells."""
        deadline = time.monotonic() + timeout
        while True:  # poll in slices, noting the processes the kernel starts on the way
            self.lab.remember_processes()
            try:
                self.page.wait_for_function(_DONE_JS, arg=first, timeout=5_000, polling=500)
                break
            except Exception as exc:  # playwright's TimeoutError
                if "Timeout" not in type(exc).__name__ or time.monotonic() > deadline:
                    raise
        self.lab.remember_processes()
        return self.cells()

    def cells(self) -> list[dict]:
        """Return what the page shows of every cell (prompts, errors, tables, widgets, images)."""
        return self.page.evaluate(_CELLS_JS)

    def screenshot(self, path: Path, full: bool = True) -> None:
        """Save a picture of the notebook (scrolled through, so lazy outputs are drawn)."""
        self.page.screenshot(path=str(path), full_page=full)


def tracebacks(cells: list[dict]) -> list[str]:
    """Return the error outputs on the page, as "cell N: first lines"."""
    found = []
    for number, cell in enumerate(cells):
        for text in cell["stderr"]:
            if TRACEBACK.search(text):
                found.append(f"cell {number} ({cell['source']!r}): {text[:600]}")
    return found
