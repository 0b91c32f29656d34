"""The bench's own sandbox: a fresh database and Redis prefix, a real `hivejobs run`, cleanup.

Never touches a user's data: everything lives in `hivejobs_bench_<random>` and under a
`hivejobs-bench:<random>:` Redis prefix, both removed at the end (also on Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import redis
from psycopg.conninfo import conninfo_to_dict

from hivejobs.bench.options import HandlerKind, WorkKind
from hivejobs.client.app import App
from hivejobs.errors import ConnectionFailed, HivejobsError
from hivejobs.store import Conn, connect
from hivejobs.urls import redact_url, scrub_known, with_database

_Handler = Callable[[int, FrameType | None], Any] | int | None
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class BenchEnvironment:
    """Owns the bench's database, Redis prefix, temp dir and worker process, and the one
    connection its own queries (`sql()`) share: opened on first use, closed in cleanup, so
    progress polling does not start a Postgres backend per poll."""

    def __init__(self, database_url: str, redis_url: str, keep: bool = False) -> None:
        self.run_id = uuid.uuid4().hex[:8]
        self.dbname = f"hivejobs_bench_{self.run_id}"
        self.server_url = database_url
        self.database_url = with_database(database_url, self.dbname)
        self.redis_url = redis_url
        self.prefix = f"hivejobs-bench:{self.run_id}:"
        self.keep = keep
        # Made (0700, failing if the name exists) once the database exists; see __enter__.
        self.workdir = Path(tempfile.gettempdir()) / f"hivejobs-bench-{uuid.uuid4().hex}"
        self.worker: subprocess.Popen[bytes] | None = None
        self.app: App | None = None
        # Curves for --plot, from the last run of each scenario: (seconds, jobs done) while
        # draining, and pickup latencies in ms. Kept out of the JSON (figures only).
        self.drain_curves: dict[str, list[tuple[float, int]]] = {}
        self.latencies_ms: list[float] = []
        self.sql_calls = 0  # statements run by sql(): the bench's own, left out of costs
        self._conn: Conn | None = None  # sql()'s connection, see the class docstring
        self._signals: dict[int, _Handler] = {}  # the handlers __enter__ replaced

    def __enter__(self) -> BenchEnvironment:
        # Ctrl-C and SIGTERM (a cancelled CI job, `timeout`) end the bench through __exit__,
        # even when it was started with SIGINT ignored (a script's background job): killed
        # outright, it left its worker running and its database, keys and temp dir behind.
        self._signals = set_stop_signals(signal.default_int_handler)
        try:
            # Both servers answer (a wrong Redis password fails here) before anything is made.
            self._ping_redis()
            maintenance = with_database(self.server_url, "postgres")
            with connect(maintenance) as conn:
                conn.execute(f'CREATE DATABASE "{self.dbname}"')
            self.workdir.mkdir(mode=0o700)
            self.app = App(
                database_url=self.database_url, redis_url=self.redis_url, prefix=self.prefix
            )
            self.app.migrate()
            from hivejobs.bench import benchapp

            # The bench enqueues through the worker's job type, declared as the worker would.
            self.app.types.update(benchapp.app.types)  # the dict its Core reads
            self.app.connections.store.upsert_job_types([t.info() for t in self.app.types.values()])
        except BaseException:
            self._report(self._cleanup())  # a half-made sandbox is removed too
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        failed = self._cleanup()
        if failed and exc_type is None:
            raise HivejobsError("; ".join(failed))
        self._report(failed)  # the error that ended the bench is the one to show

    def _cleanup(self) -> list[str]:
        """Every step runs even when an earlier one fails (a Redis that refuses us must not
        leave the database and the temp dir behind), and a second Ctrl-C or SIGTERM does not
        cut them short; returns what failed."""
        set_stop_signals(signal.SIG_IGN)
        try:
            return self._cleanup_steps()
        finally:
            restore_signals(self._signals)

    def _cleanup_steps(self) -> list[str]:
        steps = [
            ("stop the worker", self.stop_worker),
            ("close the app", self._close_app),
            ("close the bench's connection", self._close_sql),
        ]
        if not self.keep:
            steps += [
                ("delete the bench's Redis keys", lambda: self.clear_redis(False)),
                ("drop the bench database", self._drop_database),
                ("remove the temp dir", lambda: shutil.rmtree(self.workdir, ignore_errors=True)),
            ]
        failed: list[str] = []
        for what, step in steps:
            try:
                step()
            except Exception as error:  # the other steps must still run
                failed.append(f"could not {what}: {type(error).__name__}: {error}")
        return failed

    @staticmethod
    def _report(failed: list[str]) -> None:
        for line in failed:
            print(f"hivejobs bench: {scrub_known(line)}", file=sys.stderr)

    def _ping_redis(self) -> None:
        client = redis.Redis.from_url(self.redis_url, socket_connect_timeout=5)
        try:
            client.ping()
        except redis.RedisError as exc:
            reason = scrub_known(str(exc).strip() or type(exc).__name__)
            raise ConnectionFailed("Redis", redact_url(self.redis_url), reason) from None
        finally:
            client.close()

    def _close_app(self) -> None:
        if self.app is not None:
            self.app.close()
            self.app = None

    def _close_sql(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _drop_database(self) -> None:
        maintenance = with_database(self.server_url, "postgres")
        with connect(maintenance) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')

    def describe(self) -> str:
        """The servers in one form (a libpq DSN or a URL may name Postgres): host and port,
        and the bench's own database and prefix there."""
        pg = conninfo_to_dict(self.database_url)
        rd = urlsplit(self.redis_url)
        pg_at = f"{pg.get('host') or 'localhost'}:{pg.get('port') or 5432}"
        rd_at = f"{rd.hostname or 'localhost'}:{rd.port or 6379}"
        return (
            f"Postgres at {pg_at} (database {self.dbname}), Redis at {rd_at} (prefix {self.prefix})"
        )

    def sql(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """One autocommit statement (one transaction) on the bench's own connection."""
        if self._conn is None:
            # No server-side prepare: psycopg's, at a statement's 5th run, is a transaction of
            # its own, which the drain cost (one transaction per sql() call) would not expect.
            self._conn = connect(self.database_url, prepare_threshold=None)
        self.sql_calls += 1
        cur = self._conn.execute(query, params)
        return cur.fetchall() if cur.description else []

    def start_worker(
        self,
        processes: int,
        concurrency: int,
        work_ms: float,
        work: WorkKind = "sleep",
        extra_env: dict[str, str] | None = None,
        handler: HandlerKind = "sync",
    ) -> None:
        """A real supervisor with its pool processes and coordinator, as in production.
        `extra_env`: more of the bench app's variables (the limits scenario's types);
        `handler`: the bench job's handler, `sync` (a `def`) or `async` (an `async def`)."""
        env = dict(os.environ, **(extra_env or {}))
        env.update(
            {
                "HIVEJOBS_DATABASE_URL": self.database_url,
                "HIVEJOBS_REDIS_URL": self.redis_url,
                "HIVEJOBS_PREFIX": self.prefix,
                "HIVEJOBS_BENCH_PROCESSES": str(processes),
                "HIVEJOBS_BENCH_CONCURRENCY": str(concurrency),
                "HIVEJOBS_BENCH_WORK_MS": str(work_ms),
                "HIVEJOBS_BENCH_WORK": work,
                "HIVEJOBS_BENCH_HANDLER": handler,
                "HIVEJOBS_BENCH_DIR": str(self.workdir),
                "HIVEJOBS_LOG_LEVEL": os.environ.get("HIVEJOBS_LOG_LEVEL", "WARNING"),
            }
        )
        log = open(self.workdir / "worker.log", "ab")  # owned by the child
        self.worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hivejobs",
                "run",
                "hivejobs.bench.benchapp:app",
                "--shutdown-timeout",
                "5",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 30
        while len(self.pool_pids()) < processes or not self.pool_pids("bench_step"):
            if self.worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the bench worker did not start; see {self.workdir / 'worker.log'}"
                )
            time.sleep(0.05)

    def pool_pids(self, pool: str = "bench_noop") -> list[int]:
        rows = self.sql(
            "SELECT pid FROM hivejobs_worker WHERE role = 'pool' AND pool = %s", (pool,)
        )
        return [int(r[0]) for r in rows]

    def stop_worker(self) -> None:
        if self.worker is None:
            return
        if self.worker.poll() is None:
            os.killpg(self.worker.pid, signal.SIGTERM)
            try:
                self.worker.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.worker.pid, signal.SIGKILL)
                self.worker.wait(5)
        self.worker = None

    def archived(self) -> int:
        return int(self.sql("SELECT count(*) FROM hivejobs_archive")[0][0])

    def reset_jobs(self) -> None:
        self.sql("TRUNCATE hivejobs_job, hivejobs_archive")
        for path in self.workdir.glob("latency.*"):
            path.unlink()

    def clear_redis(self, keep_boot_marker: bool) -> None:
        """Delete the bench's keys. Between scenarios the boot marker stays, so the
        coordinator does not take the empty lists for a flushed Redis."""
        keep = (
            {self.app.connections.broker.boot_key.encode()}
            if keep_boot_marker and self.app
            else set()
        )
        client = redis.Redis.from_url(self.redis_url)
        keys = [k for k in client.scan_iter(match=self.prefix + "*", count=1000) if k not in keep]
        if keys:
            client.delete(*keys)
        client.close()

    def latencies_us(self) -> list[int]:
        values: list[int] = []
        for path in self.workdir.glob("latency.*"):
            values += [int(v) for v in path.read_text().split()]
        return values


def set_stop_signals(handler: _Handler) -> dict[int, _Handler]:
    """Set SIGINT's and SIGTERM's handler; returns the ones they had. `default_int_handler`:
    either ends a run through its `finally` blocks, as Ctrl-C does; `SIG_IGN`: cleanup that
    a second signal must not cut short. Only the main thread may (a bench run from another
    thread keeps its process's handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}


def restore_signals(previous: dict[int, _Handler]) -> None:
    for sig, handler in previous.items():
        if handler is not None:  # None: set outside Python, nothing to put back
            signal.signal(sig, handler)
