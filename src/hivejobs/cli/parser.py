"""The argument parser of `hivejobs`: every command, option and help text, in the order
`hivejobs --help` lists them, each command bound to its function in jobs.py, fleet.py,
chains.py or processes.py. Parse errors raise UsageError (entry.py prints them).

Never runs a command: building the parser opens no connection.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from hivejobs.cli.chains import cmd_batch, cmd_chain
from hivejobs.cli.fleet import (
    cmd_cron,
    cmd_keys,
    cmd_pause,
    cmd_restart,
    cmd_resume,
    cmd_scale,
    cmd_workers,
)
from hivejobs.cli.jobs import cmd_cancel, cmd_enqueue, cmd_jobs, cmd_replay, cmd_status
from hivejobs.cli.processes import cmd_bench, cmd_dev, cmd_migrate, cmd_run, cmd_serve
from hivejobs.config import DEFAULT_DATABASE_URL, DEFAULT_PREFIX, DEFAULT_REDIS_URL
from hivejobs.errors import UsageError
from hivejobs.worker.banner import hivejobs_version

ENVIRONMENT = f"""environment:
  HIVEJOBS_DATABASE_URL  Postgres (default {DEFAULT_DATABASE_URL})
  HIVEJOBS_REDIS_URL     Redis (default {DEFAULT_REDIS_URL})
  HIVEJOBS_PREFIX        Redis key prefix (default {DEFAULT_PREFIX})
  HIVEJOBS_APP           MODULE:APP when --app is not given
  HIVEJOBS_LOG_LEVEL     DEBUG, INFO, WARNING, ERROR (default INFO for run, serve, dev
                         and bench, WARNING for the commands that print an answer)
  HIVEJOBS_LOG_FORMAT    text (default) or json
  HIVEJOBS_<SETTING>     any setting, e.g. HIVEJOBS_SHUTDOWN_TIMEOUT_S=25"""


CHAIN_FILE = """FILE.json: a chain's name, optional args, its jobs and optional sequences:
  {"name": "deploy", "args": {"env": "prod"},
   "jobs": [{"key": "build", "type": "build", "payload": {}},
            {"key": "ship", "type": "ship", "payload": {}, "after": ["build"],
             "tries": 3, "retry_wait": 5, "priority": 0}],
   "sequences": [{"jobs": ["build", "ship"], "retries": 1, "retry_wait": 30}]}
A job's `key` names it in `after` and in sequences; `tries` and `retry_wait` retry one job,
a sequence retries its jobs as a whole. Every job type must be one the app declares."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the environment epilog's lines, and shows an option's default when it has one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        # By identity: 0 == False, and a default of 0 is worth showing.
        shown = not (default is None or default is False or default is argparse.SUPPRESS)
        if shown and "default" not in text:
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of exiting, so `main` prints one line and
    closes what the command opened."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


ENQUEUE_CHECK = """\
The payload is checked before anything is stored. With --app (or HIVEJOBS_APP), by the
handler's own payload type; without it, against the JSON Schema the workers declared for
that type when `hivejobs run` started (kept in Postgres). A type no worker has declared a
schema for is refused without --app."""


def app_parent() -> Parser:
    """--app for every level (`hivejobs --app X chain run F`, `chain --app X run F`,
    `chain run F --app X`): only the top level has a default, so a subcommand's parser never
    overwrites a value given earlier (argparse copies a subparser's defaults over it)."""
    parent = Parser(add_help=False)
    parent.add_argument(
        "--app",
        default=argparse.SUPPRESS,
        help="MODULE:APP to load job types from (or HIVEJOBS_APP)",
    )
    return parent


def build_parser() -> Parser:
    parser = Parser(
        prog="hivejobs",
        description="Durable jobs: Redis broker, Postgres truth.",
        epilog=ENVIRONMENT + "\n\nexample:\n  hivejobs run myapp.jobs:app",
        formatter_class=HelpFormatter,
        parents=[app_parent()],
    )
    parser.set_defaults(app=None)
    parser.add_argument("--version", action="version", version=f"hivejobs {hivejobs_version()}")
    sub = parser.add_subparsers(
        dest="command", required=True, parser_class=Parser, metavar="COMMAND"
    )

    def add(
        name: str,
        fn: Callable[[argparse.Namespace], int],
        help_: str,
        app_opt: bool = True,
        details: str = "",
    ) -> Parser:
        parents = [app_parent()] if app_opt else []
        p: Parser = sub.add_parser(
            name,
            help=help_,
            description=help_ + (f"\n\n{details}" if details else ""),
            parents=parents,
            epilog=ENVIRONMENT,
            formatter_class=HelpFormatter,
        )
        p.set_defaults(fn=fn)
        return p

    add("migrate", cmd_migrate, "create the database if missing and apply migrations")
    p = add("run", cmd_run, "run the worker supervisor (pools and coordinator)", False)
    p.add_argument(
        "app_spec", metavar="MODULE:APP", help="the App to run: module path, colon, attribute"
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        help="seconds to finish jobs on SIGTERM before suspending them"
        " (default 25, or HIVEJOBS_SHUTDOWN_TIMEOUT_S)",
    )
    p.add_argument("--no-coordinator", action="store_true", help="run pools only")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port")
    p.add_argument("--metrics-host", default="127.0.0.1", help="its address (default loopback)")
    p.add_argument(
        "--log-level",
        type=str.upper,
        choices=["TRACE", "DEBUG", "INFO", "WARNING", "ERROR"],
        help="lines from this level up (or HIVEJOBS_LOG_LEVEL; default INFO)",
    )
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        help="text for people, json lines for log shippers (or HIVEJOBS_LOG_FORMAT)",
    )
    p.add_argument(
        "--reload",
        action="store_true",
        help="restart the pools gracefully when the app's Python files change (watchfiles)",
    )
    p = add("enqueue", cmd_enqueue, "enqueue one job; prints its id", details=ENQUEUE_CHECK)
    p.add_argument("name", help="the job type")
    p.add_argument("payload", metavar="JSON", help="the payload, checked before anything is stored")
    p.add_argument("--id", help="your id (idempotent: the same payload returns the job)")
    p.add_argument("--priority", type=int, help="0-9, 0 runs first (default: the type's)")
    p.add_argument("--delay", type=float, help="seconds before it may run")
    p.add_argument("--run-at", help="when it may run: ISO 8601 (UTC if no zone) or 10m, 2h")
    p.add_argument("--expires-at", help="not started by then: expired (ISO 8601 or 1h, 2d)")
    p = add("status", cmd_status, "show one job (its error as text)")
    p.add_argument("job_id", help="the id `enqueue` printed")
    p.add_argument("--payload", action="store_true", help="include the payload")
    p.add_argument("--json", action="store_true", help="the job as one JSON document")
    p.add_argument(
        "--follow",
        action="store_true",
        help="print its progress and partial results as they come, until it ends",
    )
    p = add(
        "jobs",
        cmd_jobs,
        "counts per job type (a type without a live pool is marked); with filters (or --list),"
        " live and archived jobs, newest first",
    )
    p.add_argument("--list", action="store_true", help="list jobs even without a filter")
    p.add_argument(
        "--state",
        action="append",
        help="scheduled, queued, running, succeeded, failed, cancelled, expired (repeatable)",
    )
    p.add_argument("--type", help="only jobs of this job type")
    p.add_argument("--since", help="finished (or, live, created) since: 1h, 2d or ISO 8601")
    p.add_argument("--until", help="... and before: ISO 8601 or a span back from now")
    p.add_argument("--limit", type=int, default=50, help="jobs per page (default 50)")
    p.add_argument("--after", help="the cursor printed after a full page: the next page")
    p.add_argument(
        "--by-key",
        action="store_true",
        help="with --type of a fair_by type: its keys with queued, running and scheduled jobs",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help='the counts as a JSON list; with filters, {"jobs": [...], "next": CURSOR or null}',
    )
    p = add("workers", cmd_workers, "live worker processes and their heartbeats")
    p.add_argument("--json", action="store_true", help="a JSON list instead of a table")
    add("cron", cmd_cron, "periodic schedules with their last and next tick (UTC)")
    p = add("cancel", cmd_cancel, "cancel a job (a running one is told to stop)")
    p.add_argument("job_id", help="the id `enqueue` printed")
    p = add("pause", cmd_pause, "pause a job type fleet-wide (no name: list paused types)")
    p.add_argument("name", nargs="?", help="the job type; queued jobs wait, running ones finish")
    p = add("resume", cmd_resume, "resume a paused job type")
    p.add_argument("name", help="the job type")
    p = add("scale", cmd_scale, "change a job type's concurrency fleet-wide, no restart")
    p.add_argument("name", help="the job type")
    p.add_argument("concurrency", help="threads per pool process, or 'default' (the code's)")
    p = add("keys", cmd_keys, "a sequenced job type's keys: live jobs, whose turn, holds")
    p.add_argument("name", help="a job type with sequence_by")
    p.add_argument("--release", metavar="KEY", help="let a held key go on (its JSON text)")
    p.add_argument("--limit", type=int, default=1000, help="at most this many keys")
    p.add_argument("--json", action="store_true", help="JSON instead of a table")
    p = add("replay", cmd_replay, "enqueue a finished job again; prints the new id")
    p.add_argument("job_id", help="a succeeded, failed, cancelled or expired job")
    p = add("restart", cmd_restart, "reload every worker instance gracefully (new code)")
    p.add_argument(
        "--pool",
        help="only the pool processes of this job type or pool= name (a shared pool's as a"
        " whole), restarted by their supervisor",
    )
    p.add_argument(
        "--instance",
        help="only the instance on this host, or HOST:PID of its supervisor (logged at start)",
    )
    p = add("chain", cmd_chain, "run, show, stop and list job chains")
    chain_sub = p.add_subparsers(dest="chain_command", required=True, parser_class=Parser)

    def chain_cmd(name: str, help_: str, details: str = "") -> Parser:
        c: Parser = chain_sub.add_parser(
            name,
            help=help_,
            description=help_ + (f"\n\n{details}" if details else ""),
            parents=[app_parent()],
            formatter_class=HelpFormatter,
        )
        return c

    request_id = "the id `chain run` printed"
    chain_cmd(
        "run",
        "validate and start a chain from a JSON file; prints its request id",
        CHAIN_FILE,
    ).add_argument("file", metavar="FILE.json", help="the chain, as described above")
    c = chain_cmd("status", "the chain's DAG in layers, each job's state")
    c.add_argument("request_id", help=request_id)
    c.add_argument("--log", action="store_true", help="and the job log (as `chain log`)")
    chain_cmd(
        "log", "every try: start, finish, state, error with traceback, captured output"
    ).add_argument("request_id", help=request_id)
    c = chain_cmd("stop", "stop a running chain")
    c.add_argument("request_id", help=request_id)
    c.add_argument(
        "--timeout",
        type=float,
        help="seconds before tries that ignore ctx.stopping are abandoned (default 30)",
    )
    c.add_argument("--wait", action="store_true", help="return once every try has ended")
    c = chain_cmd("list", "the latest chains, newest first")
    c.add_argument("--limit", type=int, default=50, help="chains to show")
    c.add_argument("--state", action="append", help="pending, running, succeeded, ... (repeat)")
    c.add_argument("--type", help="chains of this name (spincycle's request type)")
    c.add_argument("--job-type", help="chains with a job of this job type")
    c.add_argument("--since", help="created since: 1h, 2d or ISO 8601")
    c.add_argument("--until", help="created before: ISO 8601 or a span back from now")
    c = chain_cmd("ps", "what runs now across the fleet: job, try, host, status, age")
    c.add_argument("--limit", type=int, default=500, help="running tries to show")
    p = add("batch", cmd_batch, "show batches (app.batch): counters, callbacks, failed jobs")
    batch_sub = p.add_subparsers(dest="batch_command", required=True, parser_class=Parser)
    batch_help = "one batch: state, counts, callback jobs, the jobs that did not succeed"
    b: Parser = batch_sub.add_parser(
        "status",
        help=batch_help,
        description=batch_help,
        parents=[app_parent()],
        formatter_class=HelpFormatter,
    )
    b.add_argument("batch_id", help="the batch's id (Batch.id)")
    b.add_argument("--json", action="store_true", help="the batch as one JSON document")
    b.add_argument("--failures", type=int, default=100, help="failed jobs to list (default 100)")
    p = add("serve", cmd_serve, "HTTP API, dashboard and /metrics (needs hivejobs[web])", False)
    from hivejobs.web.options import add_serve_arguments

    add_serve_arguments(p)
    p = add(
        "dev", cmd_dev, "zero setup: embedded Postgres and Valkey, migrate, run the worker", False
    )
    p.add_argument(
        "app_spec", nargs="?", metavar="MODULE:APP", help="the App to run (none: servers only)"
    )
    p.add_argument("--data-dir", help="where the embedded servers keep their data")
    p.add_argument(
        "--print-env",
        action="store_true",
        help="start the servers detached and print export lines for other shells",
    )
    p.add_argument("--stop", action="store_true", help="stop servers left by --print-env")
    p.add_argument(
        "--reload", action="store_true", help="restart the pools when the app's code changes"
    )
    p = add("bench", cmd_bench, "load-test hivejobs on this machine", False)
    from hivejobs.bench.options import add_bench_arguments

    add_bench_arguments(p)
    return parser
