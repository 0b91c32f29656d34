"""Commands that operate the fleet: `workers`, `cron`, `pause`, `resume`, `scale`, `keys`
(a sequenced type's keys and holds), `restart`.

Each turns its arguments into one App call (or one control message) and prints the answer.
"""

from __future__ import annotations

import argparse
from datetime import UTC

import msgspec

from hivejobs.broker.channels import ControlMessage
from hivejobs.cli.shared import ExitCode, open_app, print_json, print_table
from hivejobs.cli.views import key_rows
from hivejobs.errors import InvalidArgument
from hivejobs.schedules import next_tick
from hivejobs.store.schedules import ScheduleStore


def cmd_workers(args: argparse.Namespace) -> int:
    rows = open_app(args).connections.read_store.workers()
    if args.json:
        print_json(msgspec.to_builtins(rows))
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
    print_table(table)
    return ExitCode.OK


def cmd_cron(args: argparse.Namespace) -> int:
    """Periodic schedules as the fleet declared them, with their last and next tick."""
    schedules = ScheduleStore(open_app(args).connections.store)
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
    print_table(table)
    return ExitCode.OK


def cmd_pause(args: argparse.Namespace) -> int:
    """Pause a type fleet-wide; without a name, list the paused types."""
    app = open_app(args)
    if args.name is None:
        for name in app.paused():
            print(name)
        return ExitCode.OK
    print("paused" if app.pause(args.name) else "already paused")
    return ExitCode.OK


def cmd_resume(args: argparse.Namespace) -> int:
    print("resumed" if open_app(args).resume(args.name) else "was not paused")
    return ExitCode.OK


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
    open_app(args).scale(args.name, concurrency)
    print(f"{args.name}: concurrency {args.concurrency} (pools follow within a second)")
    return ExitCode.OK


def cmd_keys(args: argparse.Namespace) -> int:
    """A sequenced type's keys (held first), or the release of a held key."""
    app = open_app(args)
    if args.release is not None:
        held_by = app.release_key(args.name, args.release)
        print(f"released (held by {held_by})" if held_by else "was not held")
        return ExitCode.OK
    keys = app.keys(args.name, args.limit)
    if args.json:
        print_json([msgspec.to_builtins(k) for k in keys])
    elif keys:
        print("\n".join(key_rows(keys)))
    else:
        print("no key has live jobs or a hold")
    return ExitCode.OK


def cmd_restart(args: argparse.Namespace) -> int:
    app = open_app(args)
    # ConnectionFailed (redacted URL) rather than a redis-py traceback
    app.connections.broker.ping()
    app.connections.broker.publish_control(
        ControlMessage(action="restart", pool=args.pool, instance=args.instance)
    )
    print("restart requested")
    return ExitCode.OK
