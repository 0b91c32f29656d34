"""Commands about groups of jobs: `chain run | status | log | stop | list | ps` and
`batch status`.

Each turns its arguments into App calls and prints what views.py draws of the answer.
"""

from __future__ import annotations

import argparse

import msgspec

from hivejobs.chains import Chain
from hivejobs.chains.render import render
from hivejobs.cli.shared import ExitCode, open_app, past_moment, print_json
from hivejobs.cli.views import batch_lines, chain_rows, log_lines, ps_rows
from hivejobs.errors import UsageError


def cmd_chain(args: argparse.Namespace) -> int:
    """`hivejobs chain run FILE.json | status ID | stop ID | list`."""
    app = open_app(args)
    if args.chain_command == "run":
        try:
            with open(args.file, "rb") as fh:
                text = fh.read()
        except OSError as exc:
            raise UsageError(f"cannot read {args.file}: {exc.strerror}") from None
        print(app.run_chain(Chain.from_json(text)))
    elif args.chain_command == "status":
        print(render(app.chain_status(args.request_id)))
        if args.log:
            print("job log")
            print("\n".join(log_lines(app.job_log(args.request_id))))
    elif args.chain_command == "log":
        print("\n".join(log_lines(app.job_log(args.request_id))))
    elif args.chain_command == "stop":
        done = app.stop_chain(args.request_id, timeout=args.timeout, wait=args.wait)
        if not done:
            print("already finished")
            return ExitCode.FAILED
        # With --wait, the state it ended in: failed wins over stopped (see the README).
        print(app.chain_status(args.request_id).state if args.wait else "stop requested")
    elif args.chain_command == "ps":
        print("\n".join(ps_rows(app.chain_ps(args.limit))))
    else:
        chains = app.list_chains(
            args.limit,
            state=args.state,
            type=args.type,
            job_type=args.job_type,
            since=past_moment(args.since),
            until=past_moment(args.until),
        )
        print("\n".join(chain_rows(chains)))
    return ExitCode.OK


def cmd_batch(args: argparse.Namespace) -> int:
    """`hivejobs batch status ID`."""
    status = open_app(args).batch_status(args.batch_id, failures=args.failures)
    if args.json:
        print_json(msgspec.to_builtins(status))
    else:
        print("\n".join(batch_lines(status)))
    return ExitCode.OK
