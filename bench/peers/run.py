"""Side-by-side benchmark of hivejobs and peer job queues, one table per invocation.

Each peer runs in its own virtualenv (``bench/peers/.venvs/<venv>``, made on first use) through
its driver ``drivers/<system>_driver.py``, which starts the peer's real worker processes,
runs the shared workload (see ``drivers/_common.py``) and prints one JSON line. This script
only prepares isolation (a Redis db index per system, a fresh Postgres database per run),
runs the drivers ``--repeats`` times, and reports medians. Standard library only, so it runs
from any interpreter; it talks to the services through ``redis-cli`` and ``psql``.

Safe on a shared Redis: a peer's db is used only when it is empty (then a marker key claims it
for this run) or holds the marker of an earlier run of this script on this machine whose
process is gone; anything else is refused with the db's key count, never flushed.

    python bench/peers/run.py [--systems rq,dramatiq,...] [--jobs 20000] [--repeats 3]
                              [--work sleep|cpu|redis] [--work-ms 0.1 | --sweep 0,0.1,1,10]
                              [--body native|sync|async|both]
                              [--json out.json] [--redis-url URL] [--redis-db N] [--pg-url URL]
                              [--pg-port PORT]

With ``--sweep`` every duration is one table; within it the repeats are interleaved (run 1
of every row, then run 2 of every row...), so that each ratio compares the same minutes of a
noisy machine.

Each row is a system and the body it ran: the blocking body (``sync``: redis-py and
``time.sleep``, on the system's threads or processes) or the asyncio body (``async``:
``redis.asyncio`` and ``asyncio.sleep``, on its loop). By default (``--body native``) each
system runs the body its users write, and hivejobs runs both, a ``def`` and an ``async def``
handler, one row each (as does ``bare``, the opt-in ceiling row: the body behind a bare Redis
list, not a job queue). The jobs report which body they ran, and a run whose jobs ran another
one (a blocking body on an event loop above all) fails instead of filling a row.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import venv
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

HERE = Path(__file__).resolve().parent
DRIVERS = HERE / "drivers"
VENVS = HERE / ".venvs"
REDIS_URL = "redis://127.0.0.1:6379"  # --redis-url / PEERS_REDIS_URL: a server, no db
PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"  # --pg-url / PEERS_PG_URL: admin URL
CLAIM_KEY = "hivejobs-peers-bench:claim"  # in each db this script uses: "host:pid" of the run
# Atomic: claim an empty db, or report who holds it (nil: keys that are not ours).
CLAIM_LUA = """
if redis.call('DBSIZE') == 0 then redis.call('SET', KEYS[1], ARGV[1]) return ARGV[1] end
local holder = redis.call('GET', KEYS[1])
if holder then return holder end
return redis.call('DBSIZE')
"""
WORK_KINDS = ("sleep", "cpu", "redis")
BODY_MODES = ("native", "sync", "async", "both")
REDIS_PIN = "redis==8.1.0"  # the completion counter's client, same in every venv


@dataclass(frozen=True)
class System:
    """One benchmarked system: where its driver runs and what it may touch."""

    name: str
    redis_db: int  # its own db index, never 0
    pip: tuple[str, ...] = ()  # empty: run with this interpreter (hivejobs itself)
    needs_pg: bool = False
    venv: str = ""  # defaults to name
    driver: str = ""  # defaults to <name>_driver.py
    variant: str = ""
    pg_port: str = ""  # defaults to --pg-port
    pythonpath: str = ""  # hivejobs from another tree (a `NAME=SRC` of --hivejobs-src)
    # the bodies it can run, its users' own first; hivejobs' users write both kinds
    bodies: tuple[str, ...] = ("sync",)
    native: tuple[str, ...] = ("sync",)


ASYNCIO = {"bodies": ("async", "sync"), "native": ("async",)}  # sync: in asyncio.to_thread


SYSTEMS = {
    s.name: s
    for s in [
        System("hivejobs", 8, needs_pg=True, bodies=("sync", "async"), native=("sync", "async")),
        System("rq", 1, ("rq==3.0.0", REDIS_PIN)),
        System("dramatiq", 2, ("dramatiq[redis]==2.2.1", REDIS_PIN)),
        System("celery", 3, ("celery[redis]==5.7.0", REDIS_PIN)),
        System("procrastinate", 4, ("procrastinate==3.10.0", REDIS_PIN), needs_pg=True, **ASYNCIO),
        # typer pinned: pgqueuer 1.6.0's `pgq run` crashes on startup with typer 0.29
        System(
            "pgqueuer",
            5,
            ("pgqueuer[asyncpg]==1.6.0", "typer==0.20.1", REDIS_PIN),
            needs_pg=True,
            **ASYNCIO,
        ),
        System("huey", 6, ("huey==3.5.4", REDIS_PIN)),
        # saq 0.26.4 imports typing_extensions without declaring it
        System("saq", 7, ("saq==0.26.4", "typing_extensions", REDIS_PIN), **ASYNCIO),
        # RQ's default forking Worker (a fork per job): opt-in, it is far slower
        System(
            "rq-fork", 9, ("rq==3.0.0", REDIS_PIN), venv="rq", driver="rq_driver.py", variant="fork"
        ),
        # arq 0.28.0 requires redis < 6: the counter's client is redis 5.3.1 there
        System("arq", 10, ("arq==0.28.0", "redis==5.3.1"), **ASYNCIO),
        # not a job queue: the body behind a bare Redis list, the ceiling of every row (opt-in).
        # Both bodies, like hivejobs; uvloop pinned as it resolves in pgqueuer's venv. db 15:
        # the systems add_systems makes count up from 11.
        System(
            "bare",
            15,
            (REDIS_PIN, "uvloop==0.23.0"),
            bodies=("sync", "async"),
            native=("sync", "async"),
        ),
    ]
}
DEFAULT_SYSTEMS = "hivejobs,rq,dramatiq,celery,procrastinate,pgqueuer,huey,saq,arq"
METRICS = [
    "enqueue_single_per_s",
    "enqueue_bulk_per_s",
    "throughput_per_s",
    "drain_wall_s",
    "pg_cpu_ms_per_job",
    "worker_cpu_ms_per_job",
    "pickup_p50_ms",
    "pickup_p99_ms",
]


def sh(cmd: list[str], **kw) -> str:
    """Run a short admin command and return its stdout (raises on failure)."""
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


class Servers:
    """Where the peers run: a Redis server (each system gets a db of it) and a Postgres
    server whose role may create databases. Only dbs this run claimed are ever flushed, and
    only databases it created are dropped."""

    def __init__(self, redis_url: str, pg_url: str, redis_db: int | None) -> None:
        parts = urlsplit(redis_url)
        self.redis_base = urlunsplit(parts._replace(path=""))
        self.redis_db = redis_db
        self.pg_url = pg_url
        self.pg_port = ""  # --pg-port: another port of the same host
        self.me = f"{socket.gethostname()}:{os.getpid()}"

    def db_of(self, system: System) -> int:
        return self.redis_db if self.redis_db is not None else system.redis_db

    def redis_url(self, db: int) -> str:
        return f"{self.redis_base}/{db}"

    def redis_cli(self, db: int, *args: str) -> str:
        if db == 0:
            raise SystemExit("redis db 0 is never used by the peers bench: pick another")
        return sh(["redis-cli", "--no-auth-warning", "-u", self.redis_url(db), *args])

    def claim(self, db: int) -> None:
        """Make db ours for this run, or stop with what holds it (its keys stay)."""
        held = self.redis_cli(db, "EVAL", CLAIM_LUA, "1", CLAIM_KEY, self.me).strip()
        if held == self.me:
            return
        host, _, pid = held.partition(":")
        if pid.isdigit() and host == socket.gethostname() and not pid_alive(int(pid)):
            # An earlier run of ours on this machine died mid-run: its leftovers are ours.
            self.redis_cli(db, "FLUSHDB")
            self.claim(db)
            return
        what = f"is in use by peers bench run {held}" if pid.isdigit() else f"holds {held} keys"
        raise RuntimeError(
            f"redis db {db} at {self.redis_base} {what}: not touching it; pick free dbs "
            "with --redis-db N or another server with --redis-url"
        )

    def release(self, db: int) -> None:
        """Empty a db this run claimed (its marker still says so), leaving it free."""
        if self.redis_cli(db, "GET", CLAIM_KEY).strip() == self.me:
            self.redis_cli(db, "FLUSHDB")

    def psql(self, sql: str, port: str = "") -> str:
        url = self.database_url(urlsplit(self.pg_url).path.lstrip("/") or "postgres", port)
        return sh(["psql", url, "-v", "ON_ERROR_STOP=1", "-tAc", sql])

    def database_url(self, name: str, port: str = "") -> str:
        """The URL of database `name` on the --pg-url server, or at `port` of its host."""
        parts = urlsplit(self.pg_url)
        port = port or self.pg_port
        if port:
            host = parts.hostname or "127.0.0.1"
            userinfo = parts.netloc.rpartition("@")[0]
            netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
            parts = parts._replace(netloc=netloc)
        return urlunsplit(parts._replace(path="/" + name))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def python_for(system: System) -> str:
    """The interpreter of the system's venv, creating/updating the venv when needed.

    A marker file holds the requirement list it was installed with, so a changed pin
    reinstalls and an unchanged one costs nothing.
    """
    if not system.pip:
        return sys.executable
    env_dir = VENVS / (system.venv or system.name)
    py = env_dir / "bin" / "python"
    marker = env_dir / ".peers-requirements"
    wanted = "\n".join(system.pip)
    if py.exists() and marker.exists() and marker.read_text() == wanted:
        return str(py)
    print(f"[{system.name}] installing {' '.join(system.pip)} into {env_dir}", flush=True)
    if not py.exists():
        venv.EnvBuilder(with_pip=True).create(env_dir)
    subprocess.run([str(py), "-m", "pip", "install", "-q", *system.pip], check=True)
    marker.write_text(wanted)
    return str(py)


def hivejobs_importable(pythonpath: str = "") -> str | None:
    """None when ``import hivejobs`` works in this interpreter, else the error line."""
    env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None
    proc = subprocess.run(
        [sys.executable, "-c", "import hivejobs"], capture_output=True, text=True, env=env
    )
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["?"])[-1]


def bodies_for(system: System, mode: str) -> tuple[str, ...]:
    """The bodies `system` runs under ``--body mode``, one row each. ``async`` leaves a system
    without an asyncio API on its blocking body (its row says so); ``sync`` runs an asyncio
    system's blocking body in a thread, never on its loop."""
    if mode == "native":
        return system.native
    if mode == "both":
        return system.bodies
    return (mode,) if mode in system.bodies else system.native


def row_name(name: str, body: str) -> str:
    return f"{name}/{body}"


def check_ran(result: dict, body: str) -> None:
    """Refuse a run whose jobs did not all run `body` (each job reports what it ran: a
    blocking body on a running event loop reports `sync-in-loop`)."""
    ran = result.get("ran") or {}
    if set(ran) != {body} or ran[body] != result.get("completions"):
        raise RuntimeError(
            f"asked for the {body} body, but the jobs ran {ran or 'nothing reported'} "
            f"({result.get('completions')} completions)"
        )


def run_driver(
    servers: Servers,
    system: System,
    py: str,
    jobs: int,
    timeout: float,
    work: tuple[str, float],
    body: str,
) -> dict:
    """One isolated run: claim its Redis db, create its database, run the driver, clean up."""
    name = system.name.replace("-", "_").replace("@", "_")
    db_name = f"peers_{name}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    redis_db = servers.db_of(system)
    port = system.pg_port  # NAME@PORT: another Postgres; else the one of --pg-url/--pg-port
    cmd = [
        py,
        str(DRIVERS / (system.driver or f"{system.name}_driver.py")),
        "--jobs",
        str(jobs),
        "--timeout",
        str(timeout),
        "--redis-url",
        servers.redis_url(redis_db),
    ]
    if system.needs_pg:
        cmd += ["--pg-url", servers.database_url(db_name, port)]
    if system.variant:
        cmd += ["--variant", system.variant]
    servers.claim(redis_db)
    if system.needs_pg:
        # a fresh random name: fails, never drops
        servers.psql(f"CREATE DATABASE {db_name}", port)
    with tempfile.TemporaryFile() as err:
        # own session: on timeout we SIGTERM the driver, whose finally stops its workers
        env = {
            **os.environ,
            "PEERS_WORK": work[0],
            "PEERS_WORK_MS": repr(work[1]),
            "PEERS_BODY": body,
        }
        if system.pythonpath:
            env["PYTHONPATH"] = system.pythonpath
        proc = subprocess.Popen(
            cmd,
            cwd=DRIVERS,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout + 120)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            out = b""
        finally:
            stop_group(proc)
            if system.needs_pg:
                servers.psql(f"DROP DATABASE IF EXISTS {db_name} WITH (FORCE)", port)
            servers.release(redis_db)
        lines = [ln for ln in out.decode().splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            err.seek(0)
            tail = err.read().decode(errors="replace")[-3000:]
            raise RuntimeError(f"driver exited {proc.returncode}\n{tail}")
    result = json.loads(lines[-1])
    if "unavailable" not in result:
        check_ran(result, body)
    return result


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the driver's group, give its cleanup 30 s, then SIGKILL."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def median_of(runs: list[dict]) -> dict:
    """Per-metric median over the successful runs (None when no run had the metric)."""
    med = {k: runs[0].get(k) for k in ("system", "body", "version", "keeps_jobs_in", "settings")}
    for key in METRICS:
        values = [r[key] for r in runs if r.get(key) is not None]
        med[key] = round(statistics.median(values), 2) if values else None
    med["runs"] = len(runs)
    return med


def environment(servers: Servers) -> dict:
    """Versions that matter for reading the numbers later."""
    info = {
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
    }
    try:
        server = servers.redis_cli(1, "INFO", "server")
        info["redis"] = next(
            ln.split(":", 1)[1].strip()
            for ln in server.splitlines()
            if ln.startswith("redis_version:")
        )
    except (subprocess.CalledProcessError, StopIteration, OSError) as exc:
        info["redis"] = f"unknown ({exc})"
    try:
        info["postgres"] = servers.psql("SHOW server_version").strip()
    except (subprocess.CalledProcessError, OSError) as exc:
        info["postgres"] = f"unknown ({exc})"
    return info


def fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


BODY_NAMES = {"sync": "blocking", "async": "asyncio"}


def print_table(medians: dict[str, dict], failures: dict[str, str]) -> None:
    """One row per system and body; a ratio column for each hivejobs row (its `def` and
    `async def` handlers), then each row's settings."""
    bases = {
        body: m["throughput_per_s"]
        for key, m in medians.items()
        for body in [key.rpartition("/")[2]]
        if key.rpartition("/")[0] == "hivejobs" and m.get("throughput_per_s")
    }
    handler = {"sync": "def", "async": "async def"}
    header = [
        "system",
        "body",
        "version",
        "keeps jobs in",
        "enqueue/s (single)",
        "bulk enqueue/s",
        "throughput/s (median)",
        "PG CPU ms/job",
        "worker CPU ms/job",
        "pickup p50 ms",
        "pickup p99 ms",
        *(f"hivejobs {handler[b]} / this" for b in bases),
    ]
    rows = []
    for key, m in medians.items():
        name, _, body = key.rpartition("/")
        tp = m["throughput_per_s"]
        rows.append(
            [
                name,
                BODY_NAMES.get(body, body),
                m["version"],
                m["keeps_jobs_in"],
                fmt(m["enqueue_single_per_s"]),
                fmt(m["enqueue_bulk_per_s"]),
                fmt(tp),
                fmt(m.get("pg_cpu_ms_per_job"), 3),
                fmt(m.get("worker_cpu_ms_per_job"), 3),
                fmt(m["pickup_p50_ms"], 1),
                fmt(m["pickup_p99_ms"], 1),
                *(f"{base / tp:.2f}x" if tp else "-" for base in bases.values()),
            ]
        )
    for key, why in failures.items():
        name, _, body = key.rpartition("/")
        row = [name, BODY_NAMES.get(body, body), "-", why.splitlines()[0][:40]]
        rows.append(row + ["-"] * (len(header) - len(row)))
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for i, row in enumerate([header, *rows]):
        print(" | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
        if i == 0:
            print("-+-".join("-" * w for w in widths))
    for key, m in medians.items():
        print(f"  {key}: {m.get('settings')}")


def add_systems(names: list[str], sources: list[str], free_db: int = 10) -> None:
    """Systems made for this run: `NAME=SRC` (hivejobs from another tree) and `NAME@PORT`
    (a system on another Postgres, e.g. a cluster with autovacuum on), each on a Redis db of
    its own (--redis-db-from and up: two runs at once need apart ranges)."""
    trees = dict(src.split("=", 1) for src in sources if "=" in src)
    if len(trees) != len(sources):
        raise ValueError("--hivejobs-src takes NAME=SRC")
    for name in names:
        base, _, port = name.partition("@")
        if name in SYSTEMS and name not in trees:
            continue  # `hivejobs=SRC` is honoured: it used to run the installed copy silently
        if base in trees:
            proto = replace(SYSTEMS["hivejobs"], pythonpath=trees[base])
        elif base in SYSTEMS and port:
            proto = SYSTEMS[base]
        else:
            raise ValueError(f"unknown system {name!r}; known: {', '.join(SYSTEMS)}")
        SYSTEMS[name] = replace(
            proto,
            name=name,
            redis_db=free_db,
            pg_port=port or proto.pg_port,
            venv=proto.venv or proto.name,
            driver=proto.driver or f"{proto.name}_driver.py",
        )
        free_db += 1


def jobs_for(jobs: int, work_ms: float) -> int:
    """Fewer jobs for long bodies (at 10 ms a one-thread-per-process peer drains ~200/s):
    --jobs up to 1 ms, then --jobs / work_ms, at least 1,000."""
    return jobs if work_ms <= 1 else max(1000, min(jobs, int(jobs / work_ms)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--systems", default=DEFAULT_SYSTEMS, help=f"comma list from: {', '.join(SYSTEMS)}"
    )
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, help="write raw runs, medians and versions here")
    p.add_argument(
        "--timeout",
        type=float,
        default=0,
        help="drain timeout per run in s (default: max(120, jobs/50))",
    )
    p.add_argument("--work", default="sleep", choices=WORK_KINDS, help="the job body")
    p.add_argument("--work-ms", type=float, default=0.0, help="job duration in ms")
    p.add_argument("--sweep", help="comma list of job durations in ms (replaces --work-ms)")
    p.add_argument(
        "--body",
        default="native",
        choices=BODY_MODES,
        help="native (default): each system the body its users write (asyncio systems the "
        "asyncio one, thread/process systems the blocking one), hivejobs both a `def` and an "
        "`async def` handler (bare both bodies); sync: the blocking body everywhere (asyncio "
        "systems in asyncio.to_thread); async: the asyncio body wherever there is an asyncio API; "
        "both: every body each system can run; one row per system and body",
    )
    p.add_argument("--pg-port", default="", help="the port of --pg-url's host to use instead")
    p.add_argument(
        "--hivejobs-src",
        action="append",
        default=[],
        metavar="NAME=SRC",
        help="a system NAME that is hivejobs imported from SRC (e.g. before=/tmp/base/src:"
        " `--systems hivejobs,before`), to compare two trees in one run",
    )
    p.add_argument(
        "--redis-db-from",
        type=int,
        default=11,
        help="first Redis db of the NAME@PORT and --hivejobs-src systems (default 11)",
    )
    p.add_argument(
        "--redis-url",
        default=os.environ.get("PEERS_REDIS_URL", REDIS_URL),
        help="the Redis server (its db in the URL is ignored; env PEERS_REDIS_URL; "
        f"default {REDIS_URL})",
    )
    p.add_argument(
        "--redis-db",
        type=int,
        help="one db for every system, used one after the other (default: a db per system, "
        "1-10, bare 15); a db that holds keys not from this script is refused, never flushed",
    )
    p.add_argument(
        "--pg-url",
        default=os.environ.get("PEERS_PG_URL", PG_URL),
        help=f"a Postgres URL whose role may create databases (env PEERS_PG_URL; default {PG_URL})",
    )
    args = p.parse_args()
    # SIGTERM (a cancelled job, `timeout`) ends the run as Ctrl-C does, through the `finally`
    # that stops a driver's workers and drops its database; SIGINT too when the run was
    # started with it ignored (a script's background job).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)
    if args.redis_db is not None and not 1 <= args.redis_db <= 15:
        p.error("--redis-db must be 1-15 (db 0 is never used)")
    servers = Servers(args.redis_url, args.pg_url, args.redis_db)
    names = [s.strip() for s in args.systems.split(",") if s.strip()]
    try:
        add_systems(names, args.hivejobs_src, args.redis_db_from)
    except ValueError as exc:
        p.error(str(exc))
    try:
        sweep = [float(v) for v in args.sweep.split(",")] if args.sweep else [args.work_ms]
    except ValueError:
        p.error(f"--sweep takes milliseconds like 0,0.1,1,10, not {args.sweep!r}")
    if min(sweep) < 0:
        p.error("job durations cannot be negative")
    if args.pg_port:
        servers.pg_port = args.pg_port

    env = environment(servers)
    print(
        f"python {env['python']}, redis {env['redis']}, postgres {env['postgres']} "
        f"(port {servers.pg_port or 'of --pg-url'}, "
        f"autovacuum {servers.psql('SHOW autovacuum').strip()}), "
        f"{env['cpu_count']} cpus; jobs={args.jobs} repeats={args.repeats} work={args.work} "
        f"body={args.body}",
        flush=True,
    )
    pythons: dict[str, str] = {}
    failures: dict[str, str] = {}
    for name in names:
        system = SYSTEMS[name]
        if system.driver == "hivejobs_driver.py" or name == "hivejobs":
            why = hivejobs_importable(system.pythonpath)
        else:
            why = None
        if why:
            failures[name] = f"unavailable: {why}"
            print(f"[{name}] unavailable: {why}", flush=True)
            continue
        try:
            pythons[name] = python_for(system)
        except subprocess.CalledProcessError as exc:
            failures[name] = f"venv install failed: {exc}"
    rows = [(n, b) for n in names for b in bodies_for(SYSTEMS[n], args.body)]
    tables: dict[str, dict] = {}
    for ms in sweep:
        label = f"{args.work} {ms:g} ms"
        jobs = jobs_for(args.jobs, ms)
        timeout = args.timeout or max(120.0, jobs / 50)
        runs: dict[str, list[dict]] = {}
        failed: dict[str, str] = {
            row_name(n, b): why for n, b in rows for why in [failures.get(n)] if why
        }
        for i in range(args.repeats):
            for name, body in rows:
                key = row_name(name, body)
                if key in failed:
                    continue
                t0 = time.monotonic()
                try:
                    result = run_driver(
                        servers, SYSTEMS[name], pythons[name], jobs, timeout, (args.work, ms), body
                    )
                except Exception as exc:  # one peer failing must not stop the others
                    failed[key] = f"failed: {exc}"
                    print(f"[{key}] {label} run {i + 1} FAILED: {exc}", flush=True)
                    continue
                if "unavailable" in result:
                    failed[key] = f"unavailable: {result['unavailable']}"
                    continue
                runs.setdefault(key, []).append(result)
                print(
                    f"[{key}] {label} run {i + 1}/{args.repeats} "
                    f"({time.monotonic() - t0:.0f}s): {fmt(result['throughput_per_s'])} jobs/s, "
                    f"PG CPU {fmt(result.get('pg_cpu_ms_per_job'), 3)} ms/job, "
                    f"worker CPU {fmt(result.get('worker_cpu_ms_per_job'), 3)} ms/job, "
                    f"p50 {fmt(result['pickup_p50_ms'], 1)} ms",
                    flush=True,
                )
        medians = {n: median_of(r) for n, r in runs.items()}
        for name in list(failed):
            if name in medians:  # some runs succeeded: keep them, note the failure
                medians[name]["note"] = failed.pop(name)
        print(f"\n{label}, {jobs:,} jobs per run, medians of {args.repeats}, body {args.body}:")
        print_table(medians, failed)
        print()
        tables[label] = {"jobs": jobs, "medians": medians, "runs": runs, "failures": failed}
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "environment": env,
                    "args": {
                        "jobs": args.jobs,
                        "repeats": args.repeats,
                        "systems": names,
                        "work": args.work,
                        "sweep": sweep,
                        "body": args.body,
                        "rows": [row_name(n, b) for n, b in rows],
                        "pg_port": args.pg_port,
                    },
                    "tables": tables,
                },
                indent=2,
            )
            + "\n"
        )
        print(f"wrote {args.json}")
    return 1 if tables and all(not t["medians"] for t in tables.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
