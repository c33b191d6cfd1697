"""Command line for the cluster layer: ``python -m course_lib.cluster doctor --profile lab``."""

from __future__ import annotations

import argparse

from course_lib.cluster.launch import connect_cluster

__all__ = ["main"]


def doctor_main(args: argparse.Namespace) -> int:
    """Print the doctor's table for a running cluster (the instructor's check before class)."""
    with connect_cluster(profile=args.profile, connection_file=args.file, n=args.engines) as cl:
        report = cl.doctor()
    print(report)
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the chosen job."""
    parser = argparse.ArgumentParser(prog="python -m course_lib.cluster")
    jobs = parser.add_subparsers(dest="job", required=True)
    doc = jobs.add_parser("doctor", help="check every engine of a running cluster")
    doc.add_argument("--profile", help="profile of the running cluster (ipcluster --profile)")
    doc.add_argument("--file", help="its ipcontroller-client.json, instead of a profile")
    doc.add_argument("--engines", type=int, default=None, help="engines to wait for")
    args = parser.parse_args(argv)
    if not (args.profile or args.file):
        doc.error("give --profile NAME or --file PATH of the running cluster")
    return doctor_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
