"""Command line: argparse to App calls; errors to exit codes (ExitCode, below).

Prints one line per error, never a traceback for an error we raised on purpose.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from enum import IntEnum

import msgspec
import psycopg
import redis
from loguru import logger

from hivejobs.client.app import App, load_app
from hivejobs.config import (
    DEFAULT_DATABASE_URL,
    DEFAULT_PREFIX,
    DEFAULT_REDIS_URL,
    positive_seconds,
    redact_url,
    scrub_known,
)
from hivejobs.display import escape, progress_text
from hivejobs.errors import (
    ChainInvalid,
    ConfigError,
    HivejobsError,
    InvalidArgument,
    InvalidJobType,
    JobIdConflict,
    PayloadInvalid,
    PayloadTooLarge,
    UnknownJobType,
    UsageError,
)
from hivejobs.logs import error_text
from hivejobs.serialization import decode_any
from hivejobs.worker.banner import hivejobs_version
from hivejobs.worker.reload import app_source_dirs, check_watch_available


class ExitCode(IntEnum):
    """Every exit status of a `hivejobs` command (but `run` and `dev`, which pass on the
    supervisor's or the worker's own)."""

    OK = 0
    FAILED = 1  # an error we raised on purpose, or an unexpected one (one line on stderr)
    USAGE = 2  # bad usage or bad input, as argparse exits: nothing was stored
    INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports it
    STDOUT_GONE = 141  # our reader went away (`| head`): 128 + SIGPIPE, as pipelines expect


USAGE_ERRORS = (
    UsageError,
    ChainInvalid,
    InvalidArgument,
    PayloadInvalid,
    PayloadTooLarge,
    UnknownJobType,
    InvalidJobType,
    ConfigError,
    JobIdConflict,
)


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


_OPENED: list[App] = []  # closed when the command ends: no pool left for __del__ to stop


def _app(args: argparse.Namespace) -> App:
    spec = getattr(args, "app", None) or os.environ.get("HIVEJOBS_APP")
    app = load_app(spec) if spec else App()
    _OPENED.append(app)
    return app


def _close_opened() -> None:
    while _OPENED:
        try:
            _OPENED.pop().close()
        except Exception as exc:  # the command's answer is already out
            logger.opt(exception=exc).debug("closing the app failed")


def cmd_migrate(args: argparse.Namespace) -> int:
    app = _app(args)
    applied = app.migrate()
    url = redact_url(app.settings.database_url)
    print(f"applied {', '.join(applied)} to {url}" if applied else f"schema up to date at {url}")
    return ExitCode.OK


def cmd_run(args: argparse.Namespace) -> int:
    from hivejobs.worker.supervisor import Supervisor

    # Checked before the app is imported: a NaN here would SIGKILL every pool on SIGTERM.
    timeout = args.shutdown_timeout
    if timeout is not None:
        timeout = positive_seconds("--shutdown-timeout", timeout)
    # Through the environment: every child sets its own sink up after fork from it.
    if args.log_level:
        os.environ["HIVEJOBS_LOG_LEVEL"] = args.log_level
    if args.log_format:
        os.environ["HIVEJOBS_LOG_FORMAT"] = args.log_format
    if args.reload and (missing := check_watch_available()):
        raise ConfigError(missing)
    app = load_app(args.app_spec)
    if app.testing is not None:
        raise UsageError(
            f"{args.app_spec} was made with App(testing={app.testing!r}): its jobs run in the"
            " caller at enqueue, so a worker would serve nothing; give `hivejobs run` an App"
            " made without testing="
        )
    if timeout is not None:
        app.settings.shutdown_timeout_s = timeout
    metrics = (args.metrics_host, args.metrics_port) if args.metrics_port is not None else None
    watch = app_source_dirs(args.app_spec) if args.reload else None
    return Supervisor(
        app,
        args.app_spec,
        app.settings,
        coordinator=not args.no_coordinator,
        metrics=metrics,
        watch=watch,
    ).run()


def cmd_enqueue(args: argparse.Namespace) -> int:
    app = _app(args)
    payload = decode_any(args.payload, lambda detail: PayloadInvalid(args.name, detail))
    job_id = app.enqueue(
        args.name,
        payload,
        id=args.id,
        priority=args.priority,
        delay=args.delay,
        run_at=_future(args.run_at),
        expires_at=_future(args.expires_at),
    )
    print(job_id)
    return ExitCode.OK


def _future(text: str | None) -> datetime | None:
    """--run-at / --expires-at: ISO 8601 (UTC when no zone is named) or a span from now."""
    from hivejobs.client.listing import parse_iso, parse_span

    if text is None:
        return None
    span = parse_span(text)
    return datetime.now(UTC) + span if span is not None else parse_iso(text)


def _past(text: str | None) -> datetime | None:
    """--since / --until: ISO 8601 or a span back from now ("1h")."""
    from hivejobs.client.listing import parse_moment

    return None if text is None else parse_moment(text)


def cmd_status(args: argparse.Namespace) -> int:
    app = _app(args)
    info = app.get_job(args.job_id)
    data = msgspec.to_builtins(info)
    if not args.payload:
        data.pop("payload", None)
    if args.follow:
        return _follow(app, args.job_id, args.json)
    progress = app.progress(args.job_id)
    if progress is not None:
        data["progress"] = progress_text(progress)
    if args.json:
        _print_json(data)
    else:
        print(readable_job(data))
    return ExitCode.OK


def _follow(app: App, job_id: str, as_json: bool) -> int:
    """`hivejobs status ID --follow`: a line per event (JSON lines with --json) until the job
    ends, the last progress first; each line flushed, for a pipe as for a terminal."""
    for event in app.stream(job_id):
        if as_json:
            line = escape(msgspec.json.encode(event).decode())
        elif event.kind == "progress":
            line = f"{'progress':<12} {escape(progress_text(event))}"
        elif event.kind == "emit":
            dropped = f" ({event.dropped} dropped before)" if event.dropped else ""
            line = f"{'emit':<12} {escape(msgspec.json.encode(event.data).decode())}{dropped}"
        else:
            line = f"{'ended':<12} {event.state}"
        print(line, flush=True)
    return ExitCode.OK


def readable_job(data: dict[str, object]) -> str:
    """`hivejobs status`: one field a line, times in UTC, and the error (a traceback) as the
    text it is, indented below, every line escaped."""
    error = data.pop("error", None)
    result = data.pop("result", None)
    payload = data.pop("payload", None) if "payload" in data else None
    lines = [f"{key:<12} {escape('-' if value is None else value)}" for key, value in data.items()]
    for title, value in (("payload", payload), ("result", result)):
        if value is not None:
            lines.append(f"{title:<12} {escape(msgspec.json.encode(value).decode())}")
    if error:
        lines.append("error:")
        lines += [f"  {escape(line)}" for line in str(error).rstrip().split("\n")]
    return "\n".join(lines)


def _print_json(data: object) -> None:
    text = msgspec.json.format(msgspec.json.encode(data), indent=2).decode()
    # msgspec escapes control characters in strings, not format ones (U+202E): escape lines.
    print("\n".join(escape(line) for line in text.split("\n")))


def cmd_jobs(args: argparse.Namespace) -> int:
    """Counts per type; with a filter (or --list), the jobs themselves, live and archived."""
    if args.by_key:
        return _key_counts(args)
    listing = args.list or any(
        v is not None for v in (args.state, args.type, args.since, args.until, args.after)
    )
    if listing:
        return _list_jobs(args)
    app = _app(args)
    rows = app.read_store.type_counts()
    live = app.store.live_pools(app.settings.stuck_after_s)
    if args.json:
        _print_json([{**msgspec.to_builtins(r), "live_pools": live.get(r.name, 0)} for r in rows])
        return ExitCode.OK
    header = (
        "type",
        "concurrency",
        "processes",
        "queued",
        "scheduled",
        "running",
        "failed 1h",
        "succeeded 1h",
        "live pools",
        "paused",
    )
    table: list[tuple[object, ...]] = [header]
    table += [
        (
            r.name,
            r.concurrency,
            r.processes,
            r.queued,
            r.scheduled,
            r.running,
            r.failed_last_hour,
            r.succeeded_last_hour,
            live.get(r.name, 0) or "none: not processed",
            "-" if r.paused_at is None else f"since {r.paused_at:%Y-%m-%d %H:%M:%S} UTC",
        )
        for r in rows
    ]
    _print_table(table)
    return ExitCode.OK


def _key_counts(args: argparse.Namespace) -> int:
    """`jobs --type NAME --by-key`: a fair type's keys, most queued first."""
    if args.type is None:
        raise UsageError("--by-key needs --type NAME (a job type declared with fair_by)")
    rows = _app(args).fair_keys(args.type, args.limit)
    if args.json:
        _print_json(msgspec.to_builtins(rows))
        return ExitCode.OK
    table: list[tuple[object, ...]] = [("key", "queued", "running", "scheduled")]
    table += [(r.key, r.queued, r.running, r.scheduled) for r in rows]
    _print_table(table)
    return ExitCode.OK


def _list_jobs(args: argparse.Namespace) -> int:
    from hivejobs.cli.views import job_rows
    from hivejobs.client.listing import parse_span

    span = parse_span(args.since) if args.since is not None else None
    page = _app(args).list_jobs(
        state=args.state,
        type=args.type,
        since=span if span is not None else _past(args.since),
        until=_past(args.until),
        limit=args.limit,
        after=args.after,
    )
    if args.json:
        # The HTTP API's page shape: the jobs and the cursor of the next page (null: the end).
        _print_json({"jobs": msgspec.to_builtins(page.jobs), "next": page.next})
        return ExitCode.OK
    print("\n".join(job_rows(page.jobs)))
    if page.next is not None:
        print(f"more: --after '{page.next}'", file=sys.stderr)
    return ExitCode.OK


def cmd_workers(args: argparse.Namespace) -> int:
    rows = _app(args).read_store.workers()
    if args.json:
        _print_json(msgspec.to_builtins(rows))
        return ExitCode.OK
    table: list[tuple[object, ...]] = [
        ("id", "host", "pid", "role", "pool", "started", "heartbeat age s", "running")
    ]
    table += [
        (
            w.id[:8],
            w.host,
            w.pid,
            w.role,
            w.pool or "-",
            w.started_at.astimezone(UTC).strftime("%H:%M:%S"),
            f"{w.heartbeat_age_s:.1f}",
            w.running,
        )
        for w in rows
    ]
    _print_table(table)
    return ExitCode.OK


def cmd_cron(args: argparse.Namespace) -> int:
    """Periodic schedules as the fleet declared them, with their last and next tick."""
    from hivejobs.schedules import next_tick
    from hivejobs.store.schedules import ScheduleStore

    schedules = ScheduleStore(_app(args).store)
    now = schedules.now()
    table: list[tuple[object, ...]] = [
        ("schedule", "type", "cron", "tz", "catch up", "last tick", "next tick")
    ]
    for s in schedules.states():
        last = s.last_tick.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if s.last_tick else "-"
        upcoming = next_tick(s, now).strftime("%Y-%m-%d %H:%M:%S")
        table.append(
            (s.name, s.job_type, s.cron, s.tz, "yes" if s.catch_up else "no", last, upcoming)
        )
    _print_table(table)
    return ExitCode.OK


def cmd_cancel(args: argparse.Namespace) -> int:
    done = _app(args).cancel(args.job_id)
    print("cancelled" if done else "already finished")
    return ExitCode.OK if done else ExitCode.FAILED


def cmd_pause(args: argparse.Namespace) -> int:
    """Pause a type fleet-wide; without a name, list the paused types."""
    app = _app(args)
    if args.name is None:
        for name in app.paused():
            print(name)
        return 0
    print("paused" if app.pause(args.name) else "already paused")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    print("resumed" if _app(args).resume(args.name) else "was not paused")
    return 0


def cmd_scale(args: argparse.Namespace) -> int:
    """Set a type's concurrency per pool process, fleet-wide, without a restart."""
    if args.concurrency == "default":
        concurrency = None
    elif args.concurrency.isdigit():
        concurrency = int(args.concurrency)
    else:
        raise InvalidArgument(
            f"concurrency must be a whole number or 'default', not {args.concurrency!r}"
        )
    _app(args).scale(args.name, concurrency)
    print(f"{args.name}: concurrency {args.concurrency} (pools follow within a second)")
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    """A sequenced type's keys (held first), or the release of a held key."""
    from hivejobs.cli.views import key_rows

    app = _app(args)
    if args.release is not None:
        held_by = app.release_key(args.name, args.release)
        print(f"released (held by {held_by})" if held_by else "was not held")
        return ExitCode.OK
    keys = app.keys(args.name, args.limit)
    if args.json:
        _print_json([msgspec.to_builtins(k) for k in keys])
    elif keys:
        print("\n".join(key_rows(keys)))
    else:
        print("no key has live jobs or a hold")
    return ExitCode.OK


def cmd_replay(args: argparse.Namespace) -> int:
    """The new id on stdout; what differs from the original on stderr, one line each."""
    done = _app(args).replay_job(args.job_id)
    print(done.id)
    print(f"kept priority {done.priority}", file=sys.stderr)
    for change in done.changes:
        print(change, file=sys.stderr)
    return ExitCode.OK


def cmd_restart(args: argparse.Namespace) -> int:
    from hivejobs.broker import ControlMessage

    app = _app(args)
    app.broker.ping()  # ConnectionFailed (redacted URL) rather than a redis-py traceback
    app.broker.publish_control(
        ControlMessage(action="restart", pool=args.pool, instance=args.instance)
    )
    print("restart requested")
    return ExitCode.OK


def cmd_chain(args: argparse.Namespace) -> int:
    """`hivejobs chain run FILE.json | status ID | stop ID | list`."""
    from hivejobs.chains import Chain
    from hivejobs.chains.render import render
    from hivejobs.cli.views import chain_rows, log_lines, ps_rows

    app = _app(args)
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
            since=_past(args.since),
            until=_past(args.until),
        )
        print("\n".join(chain_rows(chains)))
    return ExitCode.OK


def cmd_batch(args: argparse.Namespace) -> int:
    """`hivejobs batch status ID`."""
    from hivejobs.cli.views import batch_lines

    status = _app(args).batch_status(args.batch_id, failures=args.failures)
    if args.json:
        _print_json(msgspec.to_builtins(status))
    else:
        print("\n".join(batch_lines(status)))
    return ExitCode.OK


def cmd_serve(args: argparse.Namespace) -> int:
    from hivejobs.web.serve import serve_main

    return serve_main(args)


def cmd_dev(args: argparse.Namespace) -> int:
    from hivejobs.dev.command import dev_main

    return dev_main(
        args.app_spec, args.data_dir, args.print_env, stop=args.stop, reload=args.reload
    )


def cmd_bench(args: argparse.Namespace) -> int:
    from hivejobs.bench import run_bench

    return run_bench(args)


def _print_table(rows: Sequence[Sequence[object]]) -> None:
    """Every cell escaped (cli_views.table): names, hosts and texts come from users and
    handlers."""
    from hivejobs.cli.views import table

    print("\n".join(table(rows)))


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
    from hivejobs.bench import add_bench_arguments

    add_bench_arguments(p)
    return parser


def _check_text_arguments(args: argparse.Namespace) -> None:
    """Arguments are decoded with surrogateescape: bytes that are not UTF-8 become lone
    surrogates, which neither Postgres nor JSON can carry. Refuse them here (a file name is
    only opened, so it may be any bytes)."""
    for name, value in vars(args).items():
        if name == "file" or not isinstance(value, str):
            continue
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            shown = value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            option = name.replace("_", "-")
            raise UsageError(f"{option} {escape(shown)!r} is not valid UTF-8") from None


def _unexpected(exc: BaseException) -> str:
    """One line for an error we did not raise on purpose; the traceback at DEBUG level."""
    logger.opt(exception=exc).debug("unexpected error")
    if isinstance(exc, psycopg.Error):
        return f"Postgres error: {exc}"
    if isinstance(exc, redis.RedisError):
        return f"Redis error: {error_text(exc)}"
    return (
        f"unexpected {error_text(exc)} (a bug: please report it; "
        "HIVEJOBS_LOG_LEVEL=DEBUG shows the traceback)"
    )


def _fail(code: int, message: str) -> int:
    try:
        one_line = " ".join(escape(line) for line in message.strip().split("\n"))
        print(f"hivejobs: {scrub_known(one_line)}", file=sys.stderr)
    except (BrokenPipeError, ValueError):
        pass
    return code


def _stdout_gone() -> int:
    """The reader of our output went away (`hivejobs jobs | head -1`): not an error of ours.
    Point stdout at /dev/null so that the interpreter's final flush stays quiet, and exit as
    a process killed by SIGPIPE would (128 + 13), which pipelines expect."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return ExitCode.STDOUT_GONE


# Processes whose log is their output; the other commands answer on stdout and log warnings.
LONG_RUNNING = frozenset({"run", "serve", "dev", "bench"})


def main(argv: Sequence[str] | None = None) -> int:
    from hivejobs.logs import setup_logging

    try:
        setup_logging("cli")
        if not (sys.argv[1:] if argv is None else argv):
            # No command: the usage and the command list, and exit 2 as for any bad usage.
            print(build_parser().format_help(), file=sys.stderr, end="")
            return ExitCode.USAGE
        args = build_parser().parse_args(argv)
        if args.command not in LONG_RUNNING:
            # A one-shot command prints its own answer: the library's INFO line about the
            # same act ("job replayed", "chain stored") would say it a second time.
            setup_logging("cli", default_level="WARNING")
        _check_text_arguments(args)
        code = int(args.fn(args))
        sys.stdout.flush()  # inside the try: a closed pipe is handled below
        return code
    except BrokenPipeError:
        return _stdout_gone()
    except USAGE_ERRORS as exc:
        return _fail(ExitCode.USAGE, str(exc))
    except HivejobsError as exc:
        return _fail(ExitCode.FAILED, str(exc))
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except Exception as exc:  # one line, never a traceback with values in it
        return _fail(ExitCode.FAILED, _unexpected(exc))
    finally:
        _close_opened()
