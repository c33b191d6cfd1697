"""No lecture (the kit's plumbing). ``./kit lab``: JupyterLab on ``notebooks/``, or (``start | status | add | stop | mpi``) the lab's cluster.

The cluster's actions are :mod:`course_kit.jobs.cluster`'s ``lab`` command line; anything else
goes to JupyterLab (as root with ``--allow-root``, as ``./kit lab`` always did).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

from course_kit.jobs.handover import (
    ROOT,
    checkout_problem,
    hand_over,
    is_root,
    one_line_usage_errors,
)
from course_lib.files import atomic_write_text
from course_lib.i18n import N_, _, speaking

__all__ = ["ACTIONS", "lab_job"]

ACTIONS = ("start", "status", "add", "stop", "mpi")
USAGE = N_("""\
usage: ./kit lab [JUPYTERLAB OPTIONS]              JupyterLab on notebooks/ (./kit lab --help-all: its options)
       ./kit lab --lang ru [JUPYTERLAB OPTIONS]    the same in Russian: its interface, notebooks/ru/, the kit's messages
       ./kit lab start|status|stop HOSTS.toml      one cluster across the lab's PCs (SSH)
       ./kit lab status                            the running lab cluster, if any
       ./kit lab add HOSTS.toml PC...              start again the engines of PCs that dropped out
       ./kit lab mpi HOSTS.toml [--ranks N] -- CMD CMD as MPI ranks on the lab's PCs
       ./kit lab start|status|stop|mpi SLURM.toml  the same on a Slurm cluster (a [slurm] lab file)
./kit lab start --help: the cluster actions' options.""")


def lab_job(argv: list[str]) -> int:
    """Run a cluster action, or hand over to JupyterLab; return the exit status."""
    if argv in (["-h"], ["--help"]):
        print(_(USAGE))
        return 0
    if argv and argv[0] in ACTIONS:
        from course_kit.jobs.cluster import main

        with one_line_usage_errors("lab"):
            return main(["lab", *argv], prog="./kit")
    if (problem := checkout_problem("notebooks")) is not None:
        print(f"kit lab: {problem}", file=sys.stderr)
        return 2
    extra = ["--allow-root"] if is_root() else []
    argv, lang, problem = _language(argv)
    if problem is not None:
        print(f"kit lab: {problem}", file=sys.stderr)
        return 2
    if lang is not None:
        extra += _language_options(lang)
    lab = [sys.executable, "-m", "jupyterlab", f"--notebook-dir={ROOT / 'notebooks'}"]
    return hand_over([*lab, *extra, *argv], ROOT)


#: JupyterLab's locale for each language the course has (its language pack from PyPI).
LOCALES = {"ru": ("ru_RU", "jupyterlab-language-pack-ru-RU")}


def _language(argv: list[str]) -> tuple[list[str], str | None, str | None]:
    """Take ``--lang X`` out of ``argv``: (the rest, X or None, a one-line problem or None)."""
    rest, lang, args = [], None, iter(argv)
    for arg in args:
        if arg == "--lang":
            lang = next(args, "")
        elif arg.startswith("--lang="):
            lang = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    if lang is None or lang == "en":
        return rest, None, None
    if lang not in LOCALES:
        return (
            rest,
            None,
            _("--lang {lang}: the course has en and {langs}").format(
                lang=repr(lang), langs=", ".join(LOCALES)
            ),
        )
    module = "jupyterlab_language_pack_" + LOCALES[lang][0]
    if importlib.util.find_spec(module) is None:
        with speaking(lang):  # asked for in lang: said in lang
            problem = _("--lang {lang}: install JupyterLab's pack: pip install {pack}").format(
                lang=lang, pack=LOCALES[lang][1]
            )
        return rest, None, problem
    return rest, lang, None


def _language_options(lang: str) -> list[str]:
    """JupyterLab's options for ``lang``: its interface locale, the translated notebooks, the kit's messages."""
    settings = ROOT / ".kit" / f"lab-settings-{lang}"
    plugin = settings / "@jupyterlab" / "translation-extension" / "plugin.jupyterlab-settings"
    plugin.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(plugin, json.dumps({"locale": LOCALES[lang][0]}) + "\n")
    os.environ["COURSE_LANG"] = lang  # kernels inherit it: every notebook's messages in lang
    start = f"/lab/tree/{lang}" if (ROOT / "notebooks" / lang).is_dir() else "/lab"
    return [f"--LabApp.user_settings_dir={settings}", f"--ServerApp.default_url={start}"]
