"""Lecture 0 and the instructor's guide: the cluster's ./kit jobs, ``python -m course_kit.jobs.cluster doctor | room ...``.

``lab start | status | stop HOSTS.toml`` runs one cluster across the lab's PCs and
``lab add HOSTS.toml PC...`` re-adds PCs that dropped out (see
:mod:`course_kit.lab.cluster`); ``lab mpi HOSTS.toml -- CMD`` runs CMD as MPI ranks on the
PCs (see :mod:`course_kit.lab.mpi`); ``doctor --profile lab`` checks every engine of a running
cluster (``--network`` adds the measured matrix between PCs, ``--heatmap net.png`` draws it);
``room up N [--rate 1gbit]``, ``room status``, ``room run PC -- CMD`` and ``room down`` manage an
emulated room that stays up between commands (see :mod:`course_kit.room.state`).

Kept whole: one command line; each sub-command is a thin call into the module it names.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from course_lib.i18n import _

__all__ = ["main"]


def doctor_main(args: argparse.Namespace) -> int:
    """Print the doctor's table for a running cluster (the instructor's check before class)."""
    from course_lib.cluster.settings import ClusterError

    try:
        return _doctor(args)
    except ClusterError as exc:
        print(f"kit doctor: {_no_cluster_advice(args, exc)}", file=sys.stderr)
        return 1


def _no_cluster_advice(args: argparse.Namespace, exc: Exception) -> str:
    """Return the error as one line; where no cluster answers, advise the kit's own command."""
    text = " ".join(str(exc).split())
    if not text.startswith("no running cluster"):
        return text
    where = f"profile {args.profile!r}" if args.profile else f"connection file {args.file}"
    return (
        f"no cluster is running for {where}: start the lab's with ./kit lab start "
        "HOSTS.toml (its [controller] profile, 'lab' by default), or give the running "
        "cluster's --profile or --file ipcontroller-client.json"
    )


def _doctor(args: argparse.Namespace) -> int:
    from course_lib.cluster.launch import connect_cluster

    with connect_cluster(profile=args.profile, connection_file=args.file, n=args.engines) as cl:
        report = cl.doctor(timeout=args.timeout)
        print(report)
        if not (args.network or args.heatmap):
            return 0 if report.ok else 1
        from course_kit.network.doctor import measure_network

        network = measure_network(cl, nbytes=args.mib * 2**20, all_pairs=args.all_pairs)
    print()
    print(network)
    if args.heatmap:
        import matplotlib

        matplotlib.use("Agg")
        ax = network.heatmap()
        ax.figure.savefig(args.heatmap, dpi=120, bbox_inches="tight")
        print(f"heat map written to {args.heatmap}")
    return 0 if report.ok and network.ok else 1


def room_main(args: argparse.Namespace) -> int:
    """Bring the emulated room up or down, show it, or run a command in one of its PCs."""
    from course_kit.room import state as room_state

    state = Path(args.state) if args.state else room_state.default_state_file()
    try:
        if args.action == "up":
            room = room_state.room_up(
                args.pcs,
                args.rate,
                state,
                engines=args.engines,
                mpi_ranks=args.mpi_ranks,
                slurm=args.slurm,
                seat=args.seat,
            )
            print(room_state.describe_room(room, state))
        elif args.action == "down":
            room, errors = room_state.room_down(state)
            if room is None:
                print(f"no room is up (no state file {state}): nothing to remove")
            elif errors:
                print(f"room {room.tag}: could not remove: {'; '.join(errors)}", file=sys.stderr)
                return 1
            else:
                print(f"room {room.tag} removed: {len(room.pcs)} PCs, bridge {room.bridge}")
        elif args.action == "status":
            room = room_state.read_state(state)
            if room is None:
                print(f"no room is up (no state file {state}); start one with ./kit room up N")
                return 0
            text = room_state.describe_room(room, state, check=True)
            print(text)
            return 1 if "INCOMPLETE" in text else 0
        else:  # run
            argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            if not argv:
                print("kit room run: give a command: ./kit room run pc1 -- CMD", file=sys.stderr)
                return 2
            return room_state.run_in_room(args.pc, argv, state)
    except (room_state.RoomError, ValueError) as exc:
        print(f"kit room {args.action}: {exc}", file=sys.stderr)
        return 1
    return 0


def lab_main(args: argparse.Namespace) -> int:
    """Start, show or stop the cluster across the lab's PCs that the hosts file describes."""
    from course_kit.lab.cluster import add_pcs, lab_status, start_lab, stop_lab
    from course_kit.lab.hosts import read_hosts

    try:
        if args.hosts is None:
            if args.action == "status":
                return _bare_status()
            raise ValueError(
                _("give the hosts file: ./kit lab {action} HOSTS.toml").format(action=args.action)
            )
        from course_kit.lab.slurm import is_slurm_lab

        if is_slurm_lab(args.hosts):
            return _slurm_lab(args)
        hosts = read_hosts(args.hosts)
        if args.action == "start":  # for a bare `./kit lab status` (only a live controller counts)
            from course_kit.lab.find import remember_hosts_file

            remember_hosts_file(hosts.profile, hosts.path)
        if args.action == "mpi":
            return _lab_mpi(hosts, args)
        if args.action != "add" and args.pcs:
            raise ValueError(
                _(
                    "`lab {action}` takes no PC names ({pcs}); "
                    "re-add PCs with: ./kit lab add HOSTS PC..."
                ).format(action=args.action, pcs=" ".join(args.pcs))
            )
        if args.action == "add":
            added, seconds = add_pcs(hosts, args.pcs, timeout=args.timeout)
            if not added:
                print(f"nothing to add: the engines of {', '.join(args.pcs)} all answer")
            else:
                print(f"re-added {', '.join(added)}: their engines answered after {seconds:.1f} s")
            return 0
        if args.action == "start":
            cluster, seconds = start_lab(
                hosts, timeout=args.timeout, progress=lambda line: print(line, flush=True)
            )
            files = Path(cluster.profile_dir) / "security"
            mpi = f" (and {hosts.mpi_ranks} MPI ranks)" if hosts.mpi_ranks else ""
            print(
                f"lab cluster up: {hosts.engines} engines{mpi} on {len(hosts.pcs)} PCs answered "
                f"after {seconds:.1f} s; students: COURSE_CLUSTER_PROFILE={hosts.profile} "
                f"(or COURSE_CLUSTER_FILE={files / 'ipcontroller-client.json'}, "
                "with lab-seats.json beside it); each notebook gets a seat of its own"
            )
            return 0
        if args.action == "status":
            ok, text = lab_status(hosts)
            print(text)
            return 0 if ok else 1
        if not stop_lab(hosts, progress=lambda line: print(line, flush=True)):
            print(f"no lab cluster is running in profile {hosts.profile!r}: nothing to stop")
        else:
            print(f"lab cluster stopped: engines on {len(hosts.pcs)} PCs and the controller")
        return 0
    except (ValueError, TimeoutError) as exc:
        print(f"kit lab {args.action}: {exc}", file=sys.stderr)
        return 2


def _bare_status() -> int:
    """Show the lab cluster that runs here, found without its hosts file; 1 when none runs."""
    from course_kit.lab.cluster import lab_status
    from course_kit.lab.find import running_labs
    from course_kit.lab.hosts import read_hosts

    labs = running_labs()
    if not labs:
        print(_("no lab cluster is running on this PC: start one with ./kit lab start HOSTS.toml"))
        return 1
    ok = True
    for lab in labs:
        if lab.hosts_file is None:
            print(
                _(
                    "lab cluster running in profile {profile} (controller pid {pid}); "
                    "for its engines per PC give its hosts file: ./kit lab status HOSTS.toml"
                ).format(profile=repr(lab.profile), pid=lab.pid)
            )
            continue
        fine, text = lab_status(read_hosts(lab.hosts_file))
        print(f"{text}\n  (hosts file: {lab.hosts_file})")
        ok = ok and fine
    return 0 if ok else 1


def _slurm_lab(args: argparse.Namespace) -> int:
    """``lab ACTION SLURM.toml``: the lab's engines (or an MPI command) as Slurm jobs."""
    from course_kit.lab import slurm

    lab = slurm.read_slurm_lab(args.hosts)
    if args.action == "add":
        raise ValueError("a Slurm lab has no PCs to re-add: stop it and start it again")
    if args.action == "mpi":
        return slurm.run_slurm_mpi(lab, args.pcs, n=args.ranks)
    if args.action == "start":
        timeout = max(args.timeout, 120.0)
        cluster, seconds = slurm.start_slurm_lab(
            lab, timeout=timeout, progress=lambda line: print(line, flush=True)
        )
        files = Path(cluster.profile_dir) / "security"
        print(
            f"lab cluster up: {lab.engines} engines on {lab.nodes} Slurm nodes answered after "
            f"{seconds:.1f} s; students: COURSE_CLUSTER_PROFILE={lab.profile} (or "
            f"COURSE_CLUSTER_FILE={files / 'ipcontroller-client.json'}, with lab-seats.json "
            "beside it); ./kit lab stop cancels the job"
        )
        return 0
    if args.action == "status":
        ok, text = slurm.slurm_status(lab)
        print(text)
        return 0 if ok else 1
    if slurm.stop_slurm_lab(lab):
        print("lab cluster stopped: the Slurm job is cancelled, the controller stopped")
    else:
        print(f"no lab cluster is running in profile {lab.profile!r}: nothing to stop")
    return 0


def _lab_mpi(hosts, args: argparse.Namespace) -> int:  # noqa: ANN001
    """Run the command after ``--`` as MPI ranks on the lab's PCs; return its exit status."""
    import tempfile

    from course_kit.lab.mpi import run_lab_mpi

    with tempfile.TemporaryDirectory(prefix="kit-lab-mpi-") as folder:  # the hostfile
        return run_lab_mpi(hosts, Path(folder), args.pcs, n=args.ranks).returncode


def main(argv: list[str] | None = None, prog: str = "python -m course_kit.jobs.cluster") -> int:
    """Parse the command line and run the chosen job (``prog``: the command named in its help)."""
    parser = argparse.ArgumentParser(prog=prog)
    jobs = parser.add_subparsers(dest="job", required=True)
    doc = jobs.add_parser("doctor", help=_("check every engine of a running cluster"))
    doc.add_argument("--profile", help="profile of the running cluster (the lab's: lab)")
    doc.add_argument("--file", help="its ipcontroller-client.json, instead of a profile")
    doc.add_argument("--engines", type=int, default=None, help="engines to wait for")
    doc.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        help="seconds an engine has to answer a trivial call before it is reported unreachable",
    )
    doc.add_argument(
        "--network",
        action="store_true",
        help="also measure bandwidth and latency between PCs and to this PC",
    )
    doc.add_argument(
        "--all-pairs",
        action="store_true",
        help="with --network: every pair of PCs, not only ring neighbours",
    )
    doc.add_argument("--mib", type=int, default=8, help="with --network: message size in MiB")
    doc.add_argument("--heatmap", metavar="PNG", help="with --network: save the heat map here")
    room = jobs.add_parser("room", help=_("an emulated room of PCs on this machine (needs root)"))
    room.add_argument("--state", help="state file (default: $COURSE_ROOM_STATE or .kit/room.json)")
    actions = room.add_subparsers(dest="action", required=True)
    up = actions.add_parser("up", help="build a room of N PCs that stays up")
    up.add_argument("pcs", type=int, metavar="N", help="number of PCs")
    up.add_argument("--rate", default="1gbit", help="every link's rate (tc syntax: 1gbit, 100mbit)")
    up.add_argument(
        "--engines",
        type=int,
        default=1,
        help="engines per PC in the hosts file it writes for ./kit lab start",
    )
    up.add_argument(
        "--mpi-ranks",
        type=int,
        default=0,
        help="also that many engines that are MPI ranks ([mpi] ranks in the hosts file)",
    )
    up.add_argument(
        "--seat",
        type=int,
        default=None,
        help="engines per student's seat ([controller] seat in the hosts file; default: as asked)",
    )
    up.add_argument(
        "--slurm",
        action="store_true",
        help="also a real Slurm across the PCs, and its lab file slurm.toml (apt: slurm-wlm munge)",
    )
    actions.add_parser("down", help="remove the room that `up` built")
    actions.add_parser("status", help="show the room that is up")
    run = actions.add_parser("run", help="run a command inside one PC: run pc1 -- CMD")
    run.add_argument("pc", help="pc1, pc2, ... (or the PC's namespace)")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="the command")
    lab = jobs.add_parser("lab", help=_("one cluster across the lab's PCs, from a hosts file"))
    lab.add_argument("action", choices=["start", "status", "add", "stop", "mpi"])
    lab.add_argument(
        "hosts",
        nargs="?",
        help=_(
            "the hosts file (TOML), e.g. hosts.toml "
            "(status without it: the lab cluster running here)"
        ),
    )
    lab.add_argument(
        "pcs",
        nargs="*",
        metavar="PC",
        help=_("add: the PCs to re-add; mpi: -- the command every rank runs"),
    )
    lab.add_argument("--ranks", type=int, default=None, help=_("mpi: ranks (default: all engines)"))
    lab.add_argument("--timeout", type=float, default=120.0, help=_("seconds to wait for engines"))
    # `lab mpi FILE --ranks 4 -- CMD`: argparse cannot take options between a positional list and
    # `--`, so the command after `--` is split off first (room run keeps its own REMAINDER).
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv and argv[:2] == ["lab", "mpi"]:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    args = parser.parse_args(argv)
    if command:
        args.pcs = [*args.pcs, *command]
    if args.job == "lab":
        return lab_main(args)
    if args.job == "room":
        return room_main(args)
    if not (args.profile or args.file):
        doc.error(_("give --profile NAME or --file PATH of the running cluster"))
    return doctor_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
