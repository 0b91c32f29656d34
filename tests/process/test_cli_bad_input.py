"""Bad input: a clear error, exit 2, nothing stored; through the real CLI against
real Postgres and Redis: one line on stderr, never a traceback, and no job or chain stored."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from hivejobs import App
from tests.harness import ROOT, Instance, pool_pids, sql, wait_until
from tests.process.cli import cli_env, hivejobs

APP = "tests.apps.inputapp:app"


@pytest.fixture
def env(database_url: str, redis_prefix: str) -> dict[str, str]:
    return cli_env(
        HIVEJOBS_DATABASE_URL=database_url,
        HIVEJOBS_REDIS_URL="redis://127.0.0.1:6379/0",
        HIVEJOBS_PREFIX=redis_prefix,
        HIVEJOBS_APP=APP,
    )


def stored(url: str) -> tuple[int, int]:
    jobs = sql(url, "SELECT count(*) FROM hivejobs_job")[0][0]
    chains = sql(url, "SELECT count(*) FROM hivejobs_chain")[0][0]
    return int(jobs), int(chains)


def one_line_error(done: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hivejobs: "), done.stderr
    assert text in lines[0], lines[0]
    assert done.returncode == code, (done.returncode, done.stderr)


def chain_file(tmp_path: Path, body: bytes) -> str:
    path = tmp_path / "chain.json"
    path.write_bytes(body)
    return str(path)


DEEP_CHAIN = (
    b'{"name":"deep","jobs":[{"key":"a","type":"untyped","payload":'
    + b"[" * 3000
    + b"]" * 3000
    + b"}]}"
)
NUL_CHAIN = b'{"name":"a\\u0000b","jobs":[{"key":"a","type":"untyped"}]}'


@pytest.mark.parametrize(
    ("args", "extra_env", "code", "text"),
    [
        # argv bytes that are not UTF-8 arrive as lone surrogates
        (["enqueue", "untyped", b'"caf\xe9"'], {}, 2, "payload '\"caf\ufffd\"' is not valid"),
        (["enqueue", "untyped", "{}", "--id", b"id\xff"], {}, 2, "is not valid UTF-8"),
        (["status", b"a\xffb"], {}, 2, "is not valid UTF-8"),
        (["enqueue", "untyped", "[" * 2000 + "]" * 2000], {}, 2, "nested too deeply"),
        (["enqueue", "untyped", "{}", "--id", "a\u202eb"], {}, 2, "job id"),
        (["enqueue", "untyped", "{}", "--id", "a\u2028b"], {}, 2, "job id"),
        (["enqueue", "untyped", "{}", "--priority", "99"], {}, 2, "priority must be"),
        (["status", "a\x1b[2Jb"], {}, 2, "job id"),
        (["chain", "list", "--limit", "-5"], {}, 2, "limit must be an integer"),
        (["chain", "status", "a\x1bb"], {}, 1, "no chain with request id"),
        # Each kind of error (errors.ErrorKind) to its exit status: the caller's input is 2.
        (["enqueue", "nope", "{}"], {}, 2, "unknown job type 'nope'"),
        (
            ["enqueue", "untyped", '"xxxxxxxxxx"'],
            {"HIVEJOBS_MAX_PAYLOAD_BYTES": "8"},
            2,
            "limit of 8",
        ),
        (["status", "no-such-id"], {}, 1, "no job with id 'no-such-id'"),
        (["jobs"], {"HIVEJOBS_LOG_LEVEL": "LOUD"}, 2, "HIVEJOBS_LOG_LEVEL='LOUD'"),
        (["jobs"], {"HIVEJOBS_PREFIX": ""}, 2, "redis prefix ''"),
        (["jobs"], {"HIVEJOBS_HEARTBEAT_S": "-1"}, 2, "HIVEJOBS_HEARTBEAT_S='-1'"),
        (["run", APP, "--shutdown-timeout", "nan"], {}, 2, "--shutdown-timeout must be"),
        (["run", APP], {"HIVEJOBS_HEARTBEAT_S": "-1"}, 2, "finite number of seconds > 0"),
        (["run", APP], {"HIVEJOBS_SHUTDOWN_TIMEOUT_S": "nan"}, 2, "SHUTDOWN_TIMEOUT_S='nan'"),
        (["run", "tests.apps.inlineapp:app"], {}, 2, "made with App(testing='inline')"),
        (["restart"], {"HIVEJOBS_REDIS_URL": "redis://127.0.0.1:1/0"}, 1, "cannot reach Redis"),
        # libpq's reason itself, not only its hint ("Is the server running...", dropped: the
        # advice that follows says it)
        (
            ["jobs"],
            {"HIVEJOBS_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/x"},
            1,
            "port 1 failed: Connection refused; check that it runs",
        ),
    ],
    ids=repr,
)
def test_cli_bad_input_is_one_line_and_stores_nothing(
    env: dict[str, str],
    database_url: str,
    args: list[str | bytes],
    extra_env: dict[str, str],
    code: int,
    text: str,
) -> None:
    done = hivejobs(args, {**env, **extra_env}, timeout=30)  # `run` must not start
    one_line_error(done, code, text)
    assert done.stdout == ""
    assert stored(database_url) == (0, 0)


@pytest.mark.parametrize(
    ("body", "text"),
    [(DEEP_CHAIN, "nested too deeply"), (NUL_CHAIN, "contains NUL")],
    ids=["deep", "nul-name"],
)
def test_bad_chain_files_are_one_line_and_store_nothing(
    env: dict[str, str], database_url: str, tmp_path: Path, body: bytes, text: str
) -> None:
    done = hivejobs(["chain", "run", chain_file(tmp_path, body)], env)
    one_line_error(done, 2, text)
    assert stored(database_url) == (0, 0)


def test_migrate_without_createdb_is_one_line(admin_url: str) -> None:
    role = f"hj18b_cli_nocreatedb_{uuid.uuid4().hex[:8]}"  # its own: a shared server's roles stay
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN NOCREATEDB")
    try:
        host = admin_url.split("@", 1)[1].rsplit("/", 1)[0]
        url = f"postgresql://{role}@{host}/hj18b_cli_not_created"
        done = hivejobs(["migrate"], cli_env(HIVEJOBS_DATABASE_URL=url))
        one_line_error(done, 2, f"role '{role}' may not create it")
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_output_into_a_closed_pipe_is_not_a_traceback(env: dict[str, str]) -> None:
    """`hivejobs jobs | head -1`: the reader went away; exit as SIGPIPE would, quietly."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hivejobs", "jobs"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command writes its table
    err = proc.stderr.read().decode()
    assert proc.wait(30) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_chain_views_show_control_characters_escaped(env: dict[str, str], tmp_path: Path) -> None:
    """An ESC sequence or a newline in a chain name, status text or error reaches the
    terminal escaped (no screen clearing, no forged rows), in `chain status`, `chain list`
    and `status`."""
    name = "x\x1b[2Jy\nforged row\u202e"
    body = json.dumps({"name": name, "jobs": [{"key": "a", "type": "untyped"}]}).encode()
    done = hivejobs(["chain", "run", chain_file(tmp_path, body)], env)
    assert done.returncode == 0, done.stderr
    request_id = done.stdout.strip()
    sql(
        env["HIVEJOBS_DATABASE_URL"],
        "UPDATE hivejobs_chain_job SET state = 'failed', status = %s, error = %s",
        ("st\x1b[31mred\nrow", "Traceback\nValueError: bad\x1b[2J\nthing"),
    )
    for args in (["chain", "status", request_id], ["chain", "list"]):
        done = hivejobs(args, env)
        assert done.returncode == 0, done.stderr
        assert "\x1b" not in done.stdout and "\u202e" not in done.stdout, done.stdout
        assert "x\\u001b[2Jy\\u000aforged row\\u202e" in done.stdout, done.stdout
        assert not [line for line in done.stdout.splitlines() if line.startswith("forged")]
    status = hivejobs(["chain", "status", request_id], env).stdout
    assert "st\\u001b[31mred\\u000arow" in status and "thing" in status


def test_status_json_escapes_format_characters(
    env: dict[str, str], database_url: str, redis_prefix: str
) -> None:
    app = App(database_url=database_url, redis_url=env["HIVEJOBS_REDIS_URL"], prefix=redis_prefix)
    app.job("untyped")(lambda ctx, payload: None)
    job_id = app.enqueue("untyped", {"note": "rtl\u202eoverride"})
    app.close()
    sql(database_url, "UPDATE hivejobs_job SET error = %s", ("err\u2028line\x1b[2J",))
    done = hivejobs(["status", job_id, "--payload", "--json"], env)
    assert done.returncode == 0, done.stderr
    assert "\u202e" not in done.stdout and "\u2028" not in done.stdout and "\x1b" not in done.stdout
    data = json.loads(done.stdout)  # still valid JSON
    assert data["payload"] == {"note": "rtl\u202eoverride"}


def inst_env(database_url: str, redis_prefix: str) -> dict[str, str]:
    return {
        "HIVEJOBS_DATABASE_URL": database_url,
        "HIVEJOBS_REDIS_URL": "redis://127.0.0.1:6379/0",
        "HIVEJOBS_PREFIX": redis_prefix,
    }


def test_a_stored_payload_nested_100k_deep_fails_at_once(
    start_instance: Callable[..., Instance], database_url: str, redis_prefix: str
) -> None:
    """It was retried as an ordinary failure (RecursionError); it can never decode."""
    app = App(database_url=database_url, redis_url="redis://127.0.0.1:6379/0", prefix=redis_prefix)
    app.job("untyped", attempts=3)(lambda ctx, payload: None)
    job_id = app.enqueue("untyped", [])
    app.close()
    deep = b"[" * 100_000 + b"]" * 100_000
    sql(database_url, "UPDATE hivejobs_job SET payload = %s WHERE id = %s", (deep, job_id))
    inst = start_instance(app_spec=APP)

    def archived() -> list[tuple[object, ...]]:
        return sql(
            database_url,
            "SELECT state, attempt, error FROM hivejobs_archive WHERE id = %s",
            (job_id,),
        )

    (state, attempt, error) = wait_until(archived, timeout=60, what="the job archived")[0]
    assert (state, attempt) == ("failed", 1), (state, attempt, error)
    assert "stored payload does not decode" in str(error)
    done = hivejobs(["status", job_id], cli_env(**inst_env(database_url, redis_prefix)))
    one_line_error(done, 2, "stored value does not decode: nested too deeply")
    inst.stop()


def test_a_malformed_dispatch_notification_is_dropped_alone(
    start_instance: Callable[..., Instance], database_url: str, redis_prefix: str
) -> None:
    """Any role may NOTIFY: a malformed payload made the listener drop its whole batch, and
    priority 99 created a list that nothing pops."""
    import redis

    inst = start_instance(app_spec=APP)
    wait_until(lambda: pool_pids(database_url, "untyped"), what="the pool")
    app = App(database_url=database_url, redis_url="redis://127.0.0.1:6379/0", prefix=redis_prefix)
    app.types.clear()
    wait_until(
        lambda: "untyped" in {t.name for t in app.connections.store.job_types()},
        what="the declared type",
    )
    listening = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND query = 'LISTEN hivejobs_chain'"
    )
    wait_until(lambda: sql(database_url, listening)[0][0], what="the coordinator listening")
    with psycopg.connect(database_url) as conn:
        for forged in ("garbage", "untyped\t99\tforged", "untyped\tx\ty"):
            conn.execute("SELECT pg_notify('hivejobs_dispatch', %s)", (forged,))
        job_id = app.enqueue("untyped", {}, conn=conn)  # its NOTIFY comes in the same batch
    wait_until(lambda: app.get_job(job_id).state == "succeeded", what="the good job ran")
    client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    assert not client.exists(f"{redis_prefix}{{untyped}}:p99")
    client.close()
    app.close()
    wait_until(lambda: "malformed dispatch notifications ignored" in inst.log_text(), timeout=10)
    assert "dispatch listener failed" not in inst.log_text()
    inst.stop()
