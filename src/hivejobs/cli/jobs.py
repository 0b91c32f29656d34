"""Commands about single jobs and job listings: `enqueue`, `status` (and `--follow`), `jobs`
(counts per type, listings, a fair type's keys), `cancel`, `replay`.

Each turns its arguments into one App call and prints the answer; never writes SQL or Redis
keys itself.
"""

from __future__ import annotations

import argparse
import sys

import msgspec

from hivejobs.cli.shared import (
    ExitCode,
    future_moment,
    open_app,
    past_moment,
    print_json,
    print_table,
)
from hivejobs.cli.views import job_rows
from hivejobs.client.app import App
from hivejobs.client.listing import parse_span
from hivejobs.display import escape, progress_text
from hivejobs.errors import PayloadInvalid, UsageError
from hivejobs.serialization import decode_any


def cmd_enqueue(args: argparse.Namespace) -> int:
    app = open_app(args)
    payload = decode_any(args.payload, lambda detail: PayloadInvalid(args.name, detail))
    job_id = app.enqueue(
        args.name,
        payload,
        id=args.id,
        priority=args.priority,
        delay=args.delay,
        run_at=future_moment(args.run_at),
        expires_at=future_moment(args.expires_at),
    )
    print(job_id)
    return ExitCode.OK


def cmd_status(args: argparse.Namespace) -> int:
    app = open_app(args)
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
        print_json(data)
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


def cmd_jobs(args: argparse.Namespace) -> int:
    """Counts per type; with a filter (or --list), the jobs themselves, live and archived."""
    if args.by_key:
        return _key_counts(args)
    listing = args.list or any(
        v is not None for v in (args.state, args.type, args.since, args.until, args.after)
    )
    if listing:
        return _list_jobs(args)
    app = open_app(args)
    rows = app.connections.read_store.type_counts()
    live = app.connections.store.live_pools(app.settings.stuck_after_s)
    if args.json:
        print_json([{**msgspec.to_builtins(r), "live_pools": live.get(r.name, 0)} for r in rows])
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
    print_table(table)
    return ExitCode.OK


def _key_counts(args: argparse.Namespace) -> int:
    """`jobs --type NAME --by-key`: a fair type's keys, most queued first."""
    if args.type is None:
        raise UsageError("--by-key needs --type NAME (a job type declared with fair_by)")
    rows = open_app(args).fair_keys(args.type, args.limit)
    if args.json:
        print_json(msgspec.to_builtins(rows))
        return ExitCode.OK
    table: list[tuple[object, ...]] = [("key", "queued", "running", "scheduled")]
    table += [(r.key, r.queued, r.running, r.scheduled) for r in rows]
    print_table(table)
    return ExitCode.OK


def _list_jobs(args: argparse.Namespace) -> int:
    span = parse_span(args.since) if args.since is not None else None
    page = open_app(args).list_jobs(
        state=args.state,
        type=args.type,
        since=span if span is not None else past_moment(args.since),
        until=past_moment(args.until),
        limit=args.limit,
        after=args.after,
    )
    if args.json:
        # The HTTP API's page shape: the jobs and the cursor of the next page (null: the end).
        print_json({"jobs": msgspec.to_builtins(page.jobs), "next": page.next})
        return ExitCode.OK
    print("\n".join(job_rows(page.jobs)))
    if page.next is not None:
        print(f"more: --after '{page.next}'", file=sys.stderr)
    return ExitCode.OK


def cmd_cancel(args: argparse.Namespace) -> int:
    done = open_app(args).cancel(args.job_id)
    print("cancelled" if done else "already finished")
    return ExitCode.OK if done else ExitCode.FAILED


def cmd_replay(args: argparse.Namespace) -> int:
    """The new id on stdout; what differs from the original on stderr, one line each."""
    done = open_app(args).replay_job(args.job_id)
    print(done.id)
    print(f"kept priority {done.priority}", file=sys.stderr)
    for change in done.changes:
        print(change, file=sys.stderr)
    return ExitCode.OK
