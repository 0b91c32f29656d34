"""What a drain costs Postgres per job: transactions, rows written, buffers, backend CPU, and
the claim and completion batch sizes that explain them.

Read from the server itself, so the same figures exist for any code under test:
- pg_stat_database deltas of the bench database (transactions, rows inserted + updated +
  deleted, buffers hit + read), less the bench's own progress counts (one autocommit
  statement each, counted by BenchEnvironment.sql). Every hot statement of a pool runs in
  autocommit, so transactions per job are its statements per job; a backend reports its
  counts when it ends, or when idle at most once a second, so they are read once every other
  session has ended and the bench's own session has been told to report (Postgres 15+:
  on older servers the stats collector reports within about 0.5 s, so theirs are that near);
- CPU time (user + system, psutil) of the database's backends between the start
  of the worker and the end of the drain: only when Postgres runs on this machine; also
  split by the role each backend's application_name names (the pools' connections, the
  coordinator's), which says whether a figure is per-job work or a fixed cost a second;
- batch sizes from the archive: a claim stamps `started_at = now()` and a completion
  `finished_at = now()`, the time of its transaction, so the distinct values count the
  claim and the completion transactions (two at the same microsecond would count as one).
"""

from __future__ import annotations

import time

import psutil

from hivejobs.bench.environment import BenchEnvironment

Figures = dict[str, float]
COUNTERS = (
    "SELECT xact_commit + xact_rollback, tup_inserted + tup_updated + tup_deleted, "
    "blks_hit + blks_read FROM pg_stat_database WHERE datname = current_database()"
)


class DrainCost:
    """Snapshot before the worker starts, CPU at the end of the drain, counters after it."""

    def __init__(self, env: BenchEnvironment) -> None:
        self.env = env
        quiesce(env)
        report_own_counts(env)
        self.sql_calls = env.sql_calls  # from here on, each sql() is one transaction of ours
        self.counters = env.sql(COUNTERS)[0]
        self.cpu_at_start = backend_cpu_s(env)
        self.cpu_s = 0.0
        self.cpu_s_by_role: dict[str, float] = {}

    def drained(self) -> None:
        """Call before stopping the worker: its backends' CPU time ends with them."""
        for pid, (role, cpu_s) in backends(self.env).items():
            spent = cpu_s - self.cpu_at_start.get(pid, 0.0)
            self.cpu_s += spent
            self.cpu_s_by_role[role] = self.cpu_s_by_role.get(role, 0.0) + spent

    def figures(self, jobs: int, prefix: str = "") -> Figures:
        """Call after the worker stopped. Per-job figures of the whole run."""
        quiesce(self.env)
        report_own_counts(self.env)
        own = self.env.sql_calls - self.sql_calls  # the first read up to the report just made
        end = self.env.sql(COUNTERS)[0]
        xacts, tuples, blocks = (int(e) - int(s) for e, s in zip(end, self.counters, strict=True))
        claims, completions = self.env.sql(
            "SELECT count(DISTINCT started_at), count(DISTINCT finished_at) FROM hivejobs_archive"
        )[0]
        figures = {
            f"{prefix}pg_xacts_per_job": (xacts - own) / jobs,
            f"{prefix}pg_rows_written_per_job": tuples / jobs,
            f"{prefix}pg_buffers_per_job": blocks / jobs,
            f"{prefix}claim_batch": jobs / max(int(claims), 1),
            f"{prefix}completion_batch": jobs / max(int(completions), 1),
        }
        if self.cpu_s > 0:
            figures[f"{prefix}pg_cpu_ms_per_job"] = self.cpu_s * 1000 / jobs
            for role in ("pools", "coordinator"):
                spent = self.cpu_s_by_role.get(role, 0.0)
                figures[f"{prefix}pg_cpu_ms_per_job_{role}"] = spent * 1000 / jobs
        return figures


def report_own_counts(env: BenchEnvironment) -> None:
    """Make pg_stat_database include every statement of the bench's own session so far
    (it lives for the whole bench: its counts would otherwise arrive at its next idle flush,
    at most once a second). The flush happens as this statement's session goes idle, before
    the statement returns."""
    if int(env.sql("SHOW server_version_num")[0][0]) >= 150000:  # older: no such function
        env.sql("SELECT pg_stat_force_next_flush()")


ROLES = {"hivejobs pool": "pools", "hivejobs coordinator": "coordinator"}


def backends(env: BenchEnvironment) -> dict[int, tuple[str, float]]:
    """This database's other backends on this machine: pid -> (role, user + system CPU
    seconds). The role is "pools" or "coordinator" by the application_name hivejobs gives
    its connections (store/db.py), "other" for the rest (a supervisor, a client, a LISTEN
    session). Empty where this machine does not run them."""
    rows = env.sql(
        "SELECT pid, application_name FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    found: dict[int, tuple[str, float]] = {}
    for pid, name in rows:
        try:
            times = psutil.Process(int(pid)).cpu_times()
        except psutil.Error:
            continue  # not on this machine, or gone
        role = next((r for prefix, r in ROLES.items() if str(name).startswith(prefix)), "other")
        found[int(pid)] = (role, times.user + times.system)
    return found


def backend_cpu_s(env: BenchEnvironment) -> dict[int, float]:
    """User + system CPU seconds of this database's other backends (see backends)."""
    return {pid: cpu_s for pid, (_, cpu_s) in backends(env).items()}


def quiesce(env: BenchEnvironment) -> None:
    """Wait until no other session of this database is left: a session's counts are sure to
    have reached pg_stat_database only once it ended (an idle one may hold them for 10 s).
    The app's own sessions are closed first; its next call opens new ones. The bench's own
    session stays (see report_own_counts)."""
    if env.app is not None:
        env.app.close()
    others = (
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    deadline = time.monotonic() + 30
    while int(env.sql(others)[0][0]) > 0 and time.monotonic() < deadline:
        time.sleep(0.1)  # polling for sessions to end, with a deadline
