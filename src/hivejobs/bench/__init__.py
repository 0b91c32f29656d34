"""`hivejobs bench`: load-test hivejobs on this machine, in a sandbox of its own.

Runs the chosen scenarios `--repeats` times and reports medians next to this machine's
ceilings measured in the same run. Speed lives here and in bench/, never in unit tests.

  __init__.py     run_bench: `hivejobs bench` from its parsed arguments to the printed report
  options.py      the options, their arguments and checks
  runner.py       the plan of scenarios, run in rounds; medians
  report.py       the table, the sweep rows, versions, the plot
  environment.py  the sandbox (database, key prefix, worker processes); benchapp.py its app
  scenarios.py    the core scenarios and ceilings; one module per further scenario

Layer: the top (with web, dev, testing; under cli): may import anything below; nothing
but the CLI imports it.
"""

from __future__ import annotations

import argparse
import os
import sys

import msgspec

from hivejobs.bench.environment import BenchEnvironment
from hivejobs.bench.options import parse_options
from hivejobs.bench.report import format_report, load_warning, plot, versions
from hivejobs.bench.runner import run_scenarios


def run_bench(args: argparse.Namespace) -> int:
    opts = parse_options(args)
    from hivejobs.backends import choose_backends

    # Configured URLs, else the local servers, else embedded ones (stopped when we exit).
    chosen = choose_backends(args.database_url, args.redis_url)
    with BenchEnvironment(chosen.database_url, chosen.redis_url, keep=args.keep) as env:
        print(f"hivejobs bench on {env.describe()}, {os.cpu_count()} cores", file=sys.stderr)
        loaded = load_warning(os.getloadavg()[0], os.cpu_count() or 1)
        if loaded:
            print(loaded, file=sys.stderr)
        report = run_scenarios(env, opts)
        report["versions"] = versions(env)
    print(format_report(report))
    if args.json:
        with open(args.json, "wb") as out:
            out.write(msgspec.json.format(msgspec.json.encode(report), indent=2))
    if args.plot:
        plot(env, args.plot)
    return 0
