"""Enqueue on real Redis and Postgres: bad input stores nothing, ids are idempotent,
transactional enqueue dispatches only on commit, bulk enqueue, and connecting errors.
"""

from __future__ import annotations

import math
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from hivejobs import (
    App,
    ConnectionFailed,
    InvalidArgument,
    JobContext,
    JobIdConflict,
    JobNotFound,
    PayloadInvalid,
    PayloadTooLarge,
    SchemaMissing,
    SchemaOutdated,
    UnknownJobType,
    cli,
)
from hivejobs.broker import Broker
from hivejobs.config import settings_from_env
from hivejobs.coordinator import Coordinator
from hivejobs.coordinator.reconciler import Reconciler
from hivejobs.store import new_worker_id
from hivejobs.store.migrate import latest_version, migration_files
from tests.harness import REDIS_URL, db_url, sql, wait_until
from tests.integration.conftest import Resize

Snapshot = tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], dict[str, list[bytes]]]


def snapshot(app: App) -> Snapshot:
    """Every live and archived row, and every Redis key under the test's prefix."""
    assert app.flush()  # single enqueues push to Redis after returning
    with app.connections.store.connection() as conn:
        live = conn.execute("SELECT id, name, state, payload FROM hivejobs_job ORDER BY id")
        live_rows = live.fetchall()
        archived = conn.execute("SELECT id, state, payload FROM hivejobs_archive ORDER BY id")
        archived_rows = archived.fetchall()
    r = app.connections.broker.redis
    keys = {k.decode(): r.lrange(k, 0, -1) for k in r.scan_iter(match=app.settings.prefix + "*")}
    return live_rows, archived_rows, keys  # type: ignore[return-value]


def live_count(app: App) -> int:
    return len(snapshot(app)[0])


def queued_ids(app: App, name: str, priority: int = 0) -> list[str]:
    assert app.flush()  # single enqueues push to Redis after returning
    key = app.connections.broker.queue_key(name, priority)
    return [raw.decode() for raw in app.connections.broker.redis.lrange(key, 0, -1)]  # type: ignore[union-attr]


def in_future(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


GOOD = {"width": 640, "height": 480}


# -- every bad input: the error, its message, and nothing stored --------------------------


@pytest.mark.parametrize(
    ("name", "payload", "kwargs", "error", "message"),
    [
        (
            "resise",
            GOOD,
            {},
            UnknownJobType,
            "unknown job type 'resise': did you mean 'resize'? (known: notify, resize)",
        ),
        (
            "resize",
            {"width": "wide", "height": 480},
            {},
            PayloadInvalid,
            "payload for job type 'resize' is invalid: Expected `int`, got `str` - at `$.width`",
        ),
        ("resize", {"width": 1}, {}, PayloadInvalid, "missing required field `height`"),
        ("notify", {"when": object()}, {}, PayloadInvalid, "not JSON-serialisable"),
        ("resize", GOOD, {"id": "job\x00one"}, InvalidArgument, "contains control characters"),
        ("resize", GOOD, {"id": "job\x1bone"}, InvalidArgument, "contains control characters"),
        ("resize", GOOD, {"id": "job\x7f"}, InvalidArgument, "contains control characters"),
        (
            "resize",
            GOOD,
            {"id": "x" * 256},
            InvalidArgument,
            "job id must be a string of 1-255 characters",
        ),
        (
            "resize",
            GOOD,
            {"id": ""},
            InvalidArgument,
            "job id must be a string of 1-255 characters",
        ),
        (
            "resize",
            GOOD,
            {"priority": 10},
            InvalidArgument,
            "priority must be an integer 0-9 (0 runs first), not 10",
        ),
        ("resize", GOOD, {"priority": -1}, InvalidArgument, "priority must be an integer 0-9"),
        ("resize", GOOD, {"priority": "1"}, InvalidArgument, "priority must be an integer 0-9"),
        (
            "resize",
            GOOD,
            {"delay": -1.0},
            InvalidArgument,
            "delay must be between 0 and 31622400 seconds, not -1.0",
        ),
        ("resize", GOOD, {"delay": math.nan}, InvalidArgument, "not nan"),
        ("resize", GOOD, {"delay": math.inf}, InvalidArgument, "not inf"),
        (
            "resize",
            GOOD,
            {"run_at": datetime.now() + timedelta(hours=1)},
            InvalidArgument,
            "run_at must be timezone-aware",
        ),
        (
            "resize",
            GOOD,
            {"expires_at": datetime.now() + timedelta(hours=1)},
            InvalidArgument,
            "expires_at must be timezone-aware",
        ),
        (
            "resize",
            GOOD,
            {"expires_at": in_future(-1)},
            InvalidArgument,
            "expires_at is already in the past",
        ),
        (
            "resize",
            GOOD,
            {"delay": 5.0, "run_at": in_future(5)},
            InvalidArgument,
            "give either delay or run_at, not both",
        ),
    ],
)
def test_bad_enqueue_raises_and_stores_nothing(
    app: App,
    name: str,
    payload: object,
    kwargs: dict[str, Any],
    error: type[Exception],
    message: str,
) -> None:
    app.enqueue("resize", GOOD)  # something already there, which must stay as it is
    app.enqueue("resize", GOOD, delay=60)
    before = snapshot(app)
    with pytest.raises(error) as info:
        app.enqueue(name, payload, **kwargs)
    assert message in str(info.value)
    assert snapshot(app) == before


def test_oversize_payload_refused_and_exact_limit_accepted(make_app: Callable[..., App]) -> None:
    app = make_app(max_payload_bytes=100)

    @app.job("blob")
    def blob(ctx: JobContext, payload: str) -> None: ...

    before = snapshot(app)
    with pytest.raises(PayloadTooLarge) as info:
        app.enqueue("blob", "a" * 99)  # 99 characters and two quotes: 101 bytes
    assert str(info.value) == (
        "payload for job type 'blob' is 101 bytes, over the limit of 100 bytes; "
        "store large data elsewhere and pass a reference"
    )
    assert snapshot(app) == before

    job_id = app.enqueue("blob", "a" * 98)
    assert app.get_job(job_id).payload == "a" * 98
    assert len(snapshot(app)[0][0][3]) == 100
    assert queued_ids(app, "blob") == [job_id]


def test_id_of_exactly_255_characters_is_accepted(app: App) -> None:
    job_id = "é" * 255  # characters, not bytes
    assert app.enqueue("resize", GOOD, id=job_id) == job_id
    assert queued_ids(app, "resize") == [job_id]


# -- idempotent ids -----------------------------------------------------------------------


def test_same_id_same_payload_returns_the_id_and_stores_one_job(app: App) -> None:
    assert app.enqueue("resize", {"width": 1, "height": 2}, id="img-1") == "img-1"
    before = snapshot(app)
    # Key order and a Struct instead of a dict do not make a different payload.
    assert app.enqueue("resize", {"height": 2, "width": 1}, id="img-1") == "img-1"
    assert app.enqueue("resize", Resize(width=1, height=2), id="img-1") == "img-1"
    assert snapshot(app) == before
    assert live_count(app) == 1
    assert queued_ids(app, "resize") == ["img-1"]  # pushed once


def test_same_id_different_payload_raises_conflict_and_changes_nothing(app: App) -> None:
    app.enqueue("resize", {"width": 1, "height": 2}, id="img-1")
    before = snapshot(app)
    with pytest.raises(JobIdConflict) as info:
        app.enqueue("resize", {"width": 1, "height": 3}, id="img-1")
    assert "job id 'img-1' already exists with a different job type or payload" in str(info.value)
    with pytest.raises(JobIdConflict):
        app.enqueue("notify", {"width": 1, "height": 2}, id="img-1")  # same bytes, other type
    assert snapshot(app) == before
    assert app.get_job("img-1").payload == {"width": 1, "height": 2}


def test_same_id_of_a_scheduled_job_is_idempotent_too(app: App) -> None:
    app.enqueue("resize", GOOD, id="later", delay=60)
    before = snapshot(app)
    assert app.enqueue("resize", GOOD, id="later", delay=60) == "later"
    assert app.enqueue("resize", GOOD, id="later") == "later"  # options do not matter
    assert snapshot(app) == before
    assert app.get_job("later").state == "scheduled"


def test_same_id_of_a_finished_job_returns_it_without_storing_or_pushing(app: App) -> None:
    app.enqueue("resize", GOOD, id="img-9", delay=60)
    app.cancel("img-9")  # finished: moved to the archive
    before = snapshot(app)
    assert app.enqueue("resize", GOOD, id="img-9") == "img-9"
    assert snapshot(app) == before  # no live row, nothing pushed
    assert app.get_job("img-9").state == "cancelled"
    with pytest.raises(JobIdConflict):
        app.enqueue("resize", {"width": 1, "height": 1}, id="img-9")
    assert snapshot(app) == before


# -- enqueue_many -------------------------------------------------------------------------


def test_enqueue_many_stores_and_pushes_ten_thousand_jobs(app: App) -> None:
    ids = app.enqueue_many("notify", ({"n": i} for i in range(10_000)))
    assert len(ids) == len(set(ids)) == 10_000
    with app.connections.store.connection() as conn:
        rows = conn.execute("SELECT state, count(*) FROM hivejobs_job GROUP BY state")
        assert rows.fetchall() == [("queued", 10_000)]
    key = app.connections.broker.queue_key("notify", 0)
    assert app.connections.broker.redis.llen(key) == 10_000
    assert queued_ids(app, "notify") == ids  # in order
    assert app.get_job(ids[1234]).payload == {"n": 1234}


def test_enqueue_many_with_priority_and_delay(app: App) -> None:
    urgent = app.enqueue_many("notify", [{"n": 1}, {"n": 2}], priority=2)
    assert queued_ids(app, "notify", priority=2) == urgent
    later = app.enqueue_many("notify", [{"n": 3}], delay=60)
    assert app.get_job(later[0]).state == "scheduled"
    assert app.enqueue_many("notify", []) == []
    assert queued_ids(app, "notify", priority=0) == []


@pytest.mark.parametrize(
    ("payloads", "kwargs", "error", "message"),
    [
        (
            [GOOD] * 500 + [{"width": "x", "height": 1}] + [GOOD] * 10,
            {},
            PayloadInvalid,
            "Expected `int`, got `str` - at `$.width`",
        ),
        ([GOOD] * 3, {"priority": 11}, InvalidArgument, "priority must be an integer 0-9"),
        ([GOOD] * 3, {"delay": -2.0}, InvalidArgument, "delay must be between 0"),
    ],
)
def test_enqueue_many_with_one_bad_element_stores_nothing(
    app: App, payloads: list[object], kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    before = snapshot(app)
    with pytest.raises(error, match=message.replace("$", r"\$").replace("`", "`")):
        app.enqueue_many("resize", payloads, **kwargs)
    assert snapshot(app) == before
    with pytest.raises(UnknownJobType, match="did you mean 'resize'"):
        app.enqueue_many("resiz", [GOOD])
    assert snapshot(app) == before


# -- transactional enqueue ---------------------------------------------------------------


def notes_until_marker(listen: psycopg.Connection[Any], database_url: str) -> list[str]:
    """Every dispatch NOTIFY so far. Notifications arrive in commit order, so once a marker
    sent now has arrived, anything committed before it has arrived too."""
    sql(database_url, "NOTIFY hivejobs_dispatch, 'marker'")
    seen: list[str] = []
    for note in listen.notifies(timeout=5):
        if note.payload == "marker":
            return seen
        seen.append(note.payload)
    raise AssertionError(f"marker never arrived; got {seen}")


def count_outside(database_url: str, job_id: str) -> int:
    return int(
        sql(database_url, "SELECT count(*) FROM hivejobs_job WHERE id = %s", (job_id,))[0][0]
    )


def test_enqueue_in_rolled_back_transaction_stores_and_dispatches_nothing(
    app: App, database_url: str, listener: psycopg.Connection[Any]
) -> None:
    before = snapshot(app)
    with psycopg.connect(database_url) as conn:
        conn.execute("SELECT 1")  # a transaction is open, as in a web request
        job_id = app.enqueue("resize", GOOD, conn=conn)
        inside = conn.execute("SELECT state FROM hivejobs_job WHERE id = %s", (job_id,))
        assert inside.fetchone() == ("queued",)
        assert count_outside(database_url, job_id) == 0
        conn.rollback()
    assert snapshot(app) == before
    with pytest.raises(JobNotFound):
        app.get_job(job_id)
    assert notes_until_marker(listener, database_url) == []


def test_enqueue_in_committed_transaction_notifies_the_dispatcher_on_commit(
    app: App, database_url: str, listener: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute("SELECT 1")
        job_id = app.enqueue("resize", GOOD, conn=conn, priority=4)
        assert notes_until_marker(listener, database_url) == []  # nothing before commit
        assert queued_ids(app, "resize", 4) == []
        conn.commit()
    assert notes_until_marker(listener, database_url) == [f"resize\t4\t{job_id}"]
    assert app.get_job(job_id).state == "queued"
    # The enqueuer does not push: the coordinator does, on the NOTIFY.
    assert queued_ids(app, "resize", 4) == []


def test_enqueue_in_committed_transaction_is_pushed_by_a_running_coordinator(
    app: App, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without the boot marker the reconciler's full restore would push the job too, and its
    # sweep would once the job is older than its grace: with an hour's grace, no other path
    # than the dispatch LISTEN can push it, however long the machine takes.
    app.connections.broker.set_boot_marker("test")
    # Coordinator.run installs signal handlers, which only the main thread may do.
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    coordinator = Coordinator(app.settings, new_worker_id())
    for service in coordinator.services:
        if isinstance(service, Reconciler):
            service.grace_s = 3600.0
    thread = threading.Thread(target=coordinator.run, name="coordinator", daemon=True)
    thread.start()
    try:
        # Ready means leading and listening: a probe NOTIFY comes back as a push.
        probe = "resize\t9\tprobe"
        wait_until(
            lambda: (
                sql(database_url, "SELECT pg_notify('hivejobs_dispatch', %s)", (probe,))
                and queued_ids(app, "resize", 9)
            ),
            timeout=5,
            what="the coordinator to lead and listen",
        )
        with psycopg.connect(database_url) as conn:
            conn.execute("SELECT 1")
            job_id = app.enqueue("resize", GOOD, conn=conn)
            conn.commit()
        wait_until(
            lambda: queued_ids(app, "resize") == [job_id],
            timeout=30,
            what="the coordinator to push the committed job",
        )
    finally:
        coordinator.stop.set()
        thread.join(10)
        coordinator.store.close()
        coordinator.broker.close()
    assert not thread.is_alive()


def test_enqueue_on_an_autocommit_connection_commits_and_pushes_at_once(
    app: App, database_url: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        job_id = app.enqueue("resize", GOOD, conn=conn)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert count_outside(database_url, job_id) == 1
        assert queued_ids(app, "resize") == [job_id]


def test_idempotent_id_inside_a_transaction(app: App, database_url: str) -> None:
    app.enqueue("resize", GOOD, id="tx-1")
    with psycopg.connect(database_url) as conn:
        conn.execute("SELECT 1")
        assert app.enqueue("resize", GOOD, id="tx-1", conn=conn) == "tx-1"
        with pytest.raises(JobIdConflict):
            app.enqueue("resize", {"width": 2, "height": 2}, id="tx-1", conn=conn)
        # The caller's transaction survives the conflict (a savepoint was rolled back).
        assert conn.execute("SELECT 1").fetchone() == (1,)
        conn.commit()
    assert live_count(app) == 1


# -- connecting -------------------------------------------------------------------------


def test_unreachable_postgres_raises_connection_failed_with_the_password_hidden() -> None:
    app = App(database_url="postgresql://hj:s3cret@127.0.0.1:1/x", redis_url=REDIS_URL)
    app.job("resize")(lambda ctx, payload: None)
    with pytest.raises(ConnectionFailed) as info:
        app.enqueue("resize", GOOD)
    text = str(info.value)
    assert text.startswith("cannot reach Postgres at postgresql://hj:***@127.0.0.1:1/x: ")
    assert "check that it runs and that the URL is right" in text
    assert "s3cret" not in text


def test_unreachable_redis_raises_connection_failed_with_the_password_hidden() -> None:
    settings = settings_from_env("postgresql://127.0.0.1/x", "redis://:s3cret@127.0.0.1:1/0")
    broker = Broker(settings)
    try:
        with pytest.raises(ConnectionFailed) as info:
            broker.ping()
    finally:
        broker.close()
    assert "cannot reach Redis at redis://:***@127.0.0.1:1/0" in str(info.value)
    assert "s3cret" not in str(info.value)


def test_enqueue_with_redis_down_is_stored_and_left_to_the_reconciler(
    database_url: str, redis_prefix: str
) -> None:
    """Postgres is the truth: once committed the job is acknowledged, even unpushed (R1)."""
    app = App(database_url=database_url, redis_url="redis://127.0.0.1:1/0", prefix=redis_prefix)
    app.job("resize")(lambda ctx, payload: None)
    try:
        job_id = app.enqueue("resize", GOOD)
        assert app.get_job(job_id).state == "queued"
    finally:
        app.close()


@pytest.fixture
def fresh_db_url(admin_url: str) -> Iterator[str]:
    """A database name nobody created; dropped afterwards if a test created it."""
    name = f"hjtest_fresh_{uuid.uuid4().hex[:12]}"
    yield db_url(admin_url, name)
    sql(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_missing_database_says_to_run_migrate(fresh_db_url: str) -> None:
    app = App(database_url=fresh_db_url, redis_url=REDIS_URL)
    with pytest.raises(ConnectionFailed, match=r"run `hivejobs migrate`, which creates it"):
        app.connections.store  # noqa: B018 - connecting is the point


def test_schema_missing_then_migrate_via_cli_is_idempotent(
    admin_url: str,
    fresh_db_url: str,
    redis_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = fresh_db_url.rsplit("/", 1)[1]
    sql(admin_url, f'CREATE DATABASE "{name}"')
    # The test's own prefix: the job enqueued at the end is pushed to Redis.
    app = App(database_url=fresh_db_url, redis_url=REDIS_URL, prefix=redis_prefix)
    app.job("resize")(lambda ctx, payload: None)
    with pytest.raises(SchemaMissing) as info:
        app.enqueue("resize", GOOD)
    assert str(info.value) == (
        "the hivejobs tables do not exist in this database: run `hivejobs migrate`"
    )
    assert sql(fresh_db_url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == [(0,)]

    # Logging setup would swap the process-wide loguru sinks for one bound to capsys.
    monkeypatch.setattr("hivejobs.logs.setup_logging", lambda *_, **__: None)
    monkeypatch.delenv("HIVEJOBS_APP", raising=False)
    monkeypatch.setenv("HIVEJOBS_DATABASE_URL", fresh_db_url)
    assert cli.main(["migrate"]) == 0
    files = ", ".join(name for _, name, _ in migration_files())
    assert capsys.readouterr().out == f"applied {files} to {fresh_db_url}\n"
    assert cli.main(["migrate"]) == 0
    assert capsys.readouterr().out == f"schema up to date at {fresh_db_url}\n"
    assert sql(fresh_db_url, "SELECT max(version) FROM hivejobs_schema_version") == [
        (latest_version(),)
    ]

    app.close()
    assert app.get_job(app.enqueue("resize", GOOD)).state == "queued"
    app.close()


def test_migrate_creates_a_missing_database(fresh_db_url: str) -> None:
    app = App(database_url=fresh_db_url, redis_url=REDIS_URL)
    assert app.migrate() == [name for _, name, _ in migration_files()]
    assert app.migrate() == []
    app.connections.store.check_schema()
    app.close()


def test_outdated_schema_says_to_run_migrate(database_url: str) -> None:
    sql(database_url, "DELETE FROM hivejobs_schema_version")
    app = App(database_url=database_url, redis_url=REDIS_URL)
    with pytest.raises(SchemaOutdated) as info:
        app.connections.store  # noqa: B018 - connecting is the point
    assert str(info.value) == (
        f"schema is at version 0, hivejobs needs {latest_version()}: run `hivejobs migrate`"
    )
