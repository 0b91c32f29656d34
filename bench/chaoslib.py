"""What every chaos scenario shares: its own database, prefix, ledger and instances, and the
checker that turns Postgres and the ledger into one result row (RELIABILITY.md 4.0).

A row says, per scenario: jobs, lost (enqueued jobs that did not end as expected), twice
(at-least-once jobs that ran to completion twice outside killed processes, plus at-most-once
jobs started twice), rescued (ended "worker lost" or re-run), recovery_s (the longest time
from a fault to the condition that says the system is well again), time_s, and result: "pass"
or "FAIL: <reason>". The pytest fault tests call the same scenario functions at CI size and
assert on the same row, so the table and the tests cannot disagree.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import psycopg
import redis

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import (  # noqa: E402
    FAST_SETTINGS,
    REDIS_URL,
    Instance,
    alive,
    db_url,
    ledger_oks,
    ledger_starts,
    pg_admin_url,
    pool_pids,
    read_ledger,
    sql,
    wait_until,
)

from hivejobs import App  # noqa: E402

Row = dict[str, object]
COLUMNS = [
    "scenario",
    "jobs",
    "lost",
    "twice",
    "rescued",
    "recovery_s",
    "time_s",
    "result",
    "notes",
]


def error_row(name: str, exc: BaseException) -> Row:
    """A scenario that could not finish: its row says why, nothing else is claimed."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())[:160]
    row: Row = {c: "-" for c in COLUMNS}
    return row | {"scenario": name, "result": f"FAIL: {text}"}


class Scenario:
    """A fresh database, prefix and ledger; instances started here are killed at the end.

    Owns `problems` (failed checks, in order) and `recoveries` (seconds from a fault to its
    recovery condition); both end up in the row built by result()."""

    def __init__(self, name: str, redis_url: str = REDIS_URL, admin_url: str | None = None) -> None:
        self.name = name
        self.admin = admin_url or pg_admin_url()
        self.dbname = f"hjchaos_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.dbname}"')
        self.url = db_url(self.admin, self.dbname)
        self.redis_url = redis_url
        self.prefix = f"hjchaos:{uuid.uuid4().hex[:8]}:"
        self.tmp = Path(tempfile.mkdtemp(prefix="hjchaos-"))
        self.ledger = self.tmp / "ledger"
        self.ledger.mkdir()
        App(database_url=self.url, redis_url=redis_url).migrate()
        self.instances: list[Instance] = []
        self.killed: set[int] = set()
        # pid -> monotonic ns when its handlers ran no more (a kill -9, or an exit seen):
        # where bench/sequence_check.py ends a run that wrote no end line.
        self.dead: dict[int, int] = {}
        self.problems: list[str] = []
        self.recoveries: list[float] = []
        self.started = time.monotonic()
        self.reruns = 0  # at-least-once re-runs by design (see result's rerun_across)
        self.judged = False  # result() ran: a scenario that raised keeps its temp dir
        self.apps: list[App] = []

    def env(self, types: str, **env: str) -> dict[str, str]:
        full = dict(os.environ)
        full.update(
            {
                "HIVEJOBS_DATABASE_URL": self.url,
                "HIVEJOBS_REDIS_URL": self.redis_url,
                "HIVEJOBS_PREFIX": self.prefix,
                "HJ_LEDGER": str(self.ledger),
                "HJ_TYPES": types,
                "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
                "HIVEJOBS_TESTING": "1",
            }
        )
        full.update({"HIVEJOBS_" + k.upper(): str(v) for k, v in FAST_SETTINGS.items()})
        full.update(env)
        return full

    def instance(
        self, types: str, app_spec: str = "tests.apps.faultapp:app", **env: str
    ) -> Instance:
        log = self.tmp / f"instance{len(self.instances)}.log"
        inst = Instance(self.env(types, **env), log, app_spec=app_spec)
        self.instances.append(inst)
        return inst

    def app(self, types: list[str], **settings: float) -> App:
        """An App enqueueing through the types the fleet declared, once its pools are up."""
        wait_until(lambda: all(pool_pids(self.url, t) for t in types), timeout=60, what="pools")
        app = App(
            database_url=self.url,
            redis_url=self.redis_url,
            prefix=self.prefix,
            testing=None,
            **{**FAST_SETTINGS, **settings},
        )
        app.types.clear()
        self.apps.append(app)
        return app

    # -- observations ------------------------------------------------------------------

    def live(self) -> int:
        """Jobs not finished; -1 while Postgres does not answer (a fault of the scenario)."""
        try:
            return int(sql(self.url, "SELECT count(*) FROM hivejobs_job")[0][0])
        except psycopg.OperationalError:
            return -1

    def done(self) -> int:
        """Jobs finished; -1 while Postgres does not answer."""
        try:
            return int(sql(self.url, "SELECT count(*) FROM hivejobs_archive")[0][0])
        except psycopg.OperationalError:
            return -1

    def wait_done(self, jobs: float, timeout: float = 180) -> None:
        wait_until(lambda: self.done() >= jobs, timeout=timeout, interval=0.1, what=f"{jobs:.0f}")

    def archived(self) -> dict[str, tuple[str, int, str]]:
        """id -> (state, attempt, last line of the error)."""
        rows = sql(self.url, "SELECT id, state, attempt, coalesce(error, '') FROM hivejobs_archive")
        return {r[0]: (r[1], r[2], (r[3].strip().splitlines() or [""])[-1]) for r in rows}

    def kill(self, pid: int, sig: int = signal.SIGKILL) -> None:
        os.kill(pid, sig)
        self.killed.add(pid)
        if sig == signal.SIGKILL:
            # Delivered before kill() returns: no handler line of pid can come after this
            # instant (noted later, a re-run elsewhere would look like an overlap).
            self.dead[pid] = time.monotonic_ns()

    def exited(self, pids: Iterable[int]) -> None:
        """Processes seen gone after a signal that let them exit (their runs ended by now)."""
        now = time.monotonic_ns()
        self.dead.update({pid: now for pid in pids if pid not in self.dead})

    # -- the checker -------------------------------------------------------------------

    def check(self, ok: object, problem: str) -> bool:
        if not ok:
            self.problems.append(problem)
        return bool(ok)

    def recovery(
        self, since: float, predicate: Callable[..., object], what: str, timeout: float = 60
    ) -> float:
        """Wait for the recovery condition of a fault injected at `since` (monotonic)."""
        wait_until(predicate, timeout=timeout, interval=0.1, what=what)
        took = time.monotonic() - since
        self.recoveries.append(took)
        return took

    def progress_after(self, since: float, jobs: int = 50, timeout: float = 60) -> float:
        """Recovery = `jobs` more jobs finished after the fault (throughput is back), or all
        that were left when fewer were (a small run may near its end at the fault)."""
        base = wait_until(lambda: self.done() + 1, timeout=timeout, what="Postgres") - 1
        left = wait_until(lambda: self.live() + 1, timeout=timeout, what="Postgres") - 1
        needed = min(jobs, left)
        return self.recovery(since, lambda: self.done() >= base + needed, "progress", timeout)

    def result(
        self,
        alo: Iterable[str] = (),
        amo: Iterable[str] = (),
        expected: dict[str, Callable[[tuple[str, int, str]], bool]] | None = None,
        timeout: float = 300,
        jobs: int | None = None,
        dead_are_killed: bool = False,
        rerun_across: int | None = None,
        stopped: set[int] | None = None,
    ) -> Row:
        """Wait until nothing is live, then judge: `alo` must succeed (ledger ok >= 1, and
        once outside killed processes), `amo` must end (ledger start <= 1), `expected` maps
        an id to a predicate over its (state, attempt, error). With `dead_are_killed`, every
        handler process that is gone by then counts as killed (scenarios whose processes die
        on purpose: a run that ended ok just before its process died is re-run, by design).
        With `rerun_across` (a monotonic_ns instant: Postgres answering again after a crash),
        an at-least-once job whose runs lie on both sides of it is a re-run by design, not a
        duplicate: a run that started before it was claimed before the crash, and that claim
        or its completion was committed asynchronously and may be lost (worker/process.py).
        A claim lost that way may be run from the pool's queue well after the crash: the
        crash instant itself does not separate the two runs, Postgres's return does.
        With `stopped` (pids of pools stopped by SIGTERM), a job whose run ended ok in one of
        them and ran again with the same attempt number is a re-run by design too: the
        pool's shutdown deadline suspended it in the instant between its handler's last
        ledger line and the runner's taking its result (a suspension gives the attempt back;
        a rescue or a retry counts a new one, so a real duplicate claim still counts)."""
        alo, amo, expected = list(alo), list(amo), expected or {}
        wait_until(lambda: self.live() == 0, timeout=timeout, interval=0.5, what="all done")
        self.judged = True
        elapsed = time.monotonic() - self.started
        if dead_are_killed:
            self.killed |= dead_handler_pids(self.ledger)
        final = self.archived()
        oks, survivors = ledger_oks(self.ledger), ledger_oks(self.ledger, self.killed)
        starts = ledger_starts(self.ledger)
        lost = [i for i in alo if final.get(i, ("",))[0] != "succeeded" or oks[i] < 1]
        lost += [i for i in amo if i not in final]
        lost += [i for i, ok in expected.items() if i not in final]
        across: set[str] = set()
        if rerun_across is not None:
            runs: dict[str, list[int]] = {}
            for parts in read_ledger(self.ledger):
                if parts[0] == "start":
                    runs.setdefault(parts[1], []).append(int(parts[4]))
            across = {i for i, t in runs.items() if min(t) < rerun_across < max(t)}
            self.reruns = len([i for i in alo if survivors[i] > 1 and i in across])
        if stopped:
            resumed = suspended_reruns(self.ledger, stopped)
            self.reruns += len([i for i in alo if survivors[i] > 1 and i in resumed - across])
            across |= resumed
        twice = [i for i in alo if survivors[i] > 1 and i not in across]
        twice += [i for i in amo if starts[i] > 1]
        wrong = [i for i, ok in expected.items() if i in final and not ok(final[i])]
        self.check(
            not lost, f"{len(lost)} lost, e.g. {lost[:1]} {final.get(lost[0]) if lost else ''}"
        )
        self.check(not twice, f"{len(twice)} ran twice, e.g. {twice[:1]}")
        self.check(not wrong, f"{len(wrong)} wrong end state, e.g. {[final[i] for i in wrong[:2]]}")
        rescued = sum(1 for s, a, e in final.values() if a > 1 or e.startswith("worker lost"))
        return {
            "scenario": self.name,
            "jobs": jobs if jobs is not None else len(alo) + len(amo) + len(expected),
            "lost": len(lost),
            "twice": len(twice),
            "rescued": rescued,
            "recovery_s": round(max(self.recoveries), 1) if self.recoveries else "-",
            "time_s": round(elapsed, 1),
            "result": "pass" if not self.problems else "FAIL: " + "; ".join(self.problems),
            "notes": "",
        }

    def rejudge(self, row: Row, twice: int | None = None, notes: str = "") -> Row:
        """After checks made once result() returned: refresh the verdict, add notes."""
        self.judged = True
        if twice is not None:
            row["twice"] = max(int(str(row["twice"])), twice)
        row["result"] = "pass" if not self.problems else "FAIL: " + "; ".join(self.problems)
        row["notes"] = notes
        return row

    def close(self) -> None:
        """Stop everything started here; the temp dir (logs, ledger) stays only on failure."""
        for app in self.apps:
            try:
                app.close()
            except Exception:  # noqa: BLE001 - cleanup after a fault may meet a dead server
                pass
        for inst in self.instances:
            inst.stop()
        try:
            with psycopg.connect(self.admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')
        except psycopg.Error:
            pass  # an own server that is being torn down anyway
        try:
            client = redis.Redis.from_url(self.redis_url)
            keys = list(client.scan_iter(match=self.prefix + "*", count=1000))
            if keys:
                client.delete(*keys)
            client.close()
        except redis.RedisError:
            pass
        if self.judged and not self.problems:
            shutil.rmtree(self.tmp, ignore_errors=True)


def suspended_reruns(ledger: Path, stopped: set[int]) -> set[str]:
    """Jobs whose ok runs of one attempt all ran in `stopped` pids but the last one."""
    began: dict[tuple[str, str, int], int] = {}
    ends: dict[tuple[str, str], list[int]] = {}  # (job, attempt) -> pids of its ok runs
    for parts in read_ledger(ledger):
        if parts[0] == "start":
            began[(parts[1], parts[2], int(parts[3]))] = int(parts[4])
        elif parts[0] == "end" and parts[3] == "ok":
            ends.setdefault((parts[1], parts[2]), []).append(int(parts[4]))
    resumed: set[str] = set()
    for (job, attempt), pids in ends.items():
        order = sorted(pids, key=lambda pid: began.get((job, attempt, pid), 0))
        if len(order) > 1 and all(p in stopped for p in order[:-1]):
            resumed.add(job)
    return resumed


def dead_handler_pids(ledger: Path) -> set[int]:
    """Pids that ran handlers and are gone now."""
    pids = {int(p[3]) for p in read_ledger(ledger) if p[0] == "start"}
    return {p for p in pids if not alive(p)}


def leader(url: str) -> tuple[int, int]:
    """(coordinator pid, term) of the current lease holder, or (0, 0)."""
    rows = sql(
        url,
        "SELECT w.pid, l.term FROM hivejobs_leader l JOIN hivejobs_worker w "
        "ON w.id = l.holder WHERE l.expires_at > now()",
    )
    return (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)


def pause(seconds: float) -> None:
    """A fault's own duration (e.g. "down for 8 s"): not synchronisation."""
    begun = time.monotonic()
    wait_until(
        lambda: time.monotonic() - begun >= seconds,
        timeout=seconds + 5,
        interval=min(0.2, seconds),
        what=f"{seconds} s",
    )


def scaled(n: int, scale: float, floor: int = 1) -> int:
    return max(floor, int(n * scale))
