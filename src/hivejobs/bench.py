"""`hivejobs bench`: placeholder replaced by the bench issue."""

from __future__ import annotations

import argparse


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=20_000)


def run_bench(args: argparse.Namespace) -> int:
    raise SystemExit("bench: not built yet")
