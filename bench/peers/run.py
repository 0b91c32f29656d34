"""Side-by-side benchmark of hivejobs and peer job queues, one table per invocation.

Each peer runs in its own virtualenv (``bench/peers/.venvs/<venv>``, made on first use) through
its driver ``drivers/<system>_driver.py``, which starts the peer's real worker processes,
runs the shared workload (see ``drivers/_common.py``) and prints one JSON line. This script
only prepares isolation (a Redis db index per system, a fresh Postgres database per run),
runs the drivers ``--repeats`` times, and reports medians. Standard library only, so it runs
from any interpreter; it talks to the services through ``redis-cli`` and ``psql``.

    python bench/peers/run.py [--systems rq,dramatiq,...] [--jobs 20000] [--repeats 3]
                              [--work sleep|cpu|redis] [--work-ms 0.1 | --sweep 0,0.1,1,10]
                              [--pg-port 5432] [--json out.json]

With ``--sweep`` every duration is one table; within it the repeats are interleaved (run 1
of every system, then run 2 of every system...), so that each ratio compares the same
minutes of a noisy machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from dataclasses import dataclass, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
DRIVERS = HERE / "drivers"
VENVS = HERE / ".venvs"
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
PG_PORT = ["5432"]  # --pg-port: e.g. a throwaway cluster with other settings
PG_URL = "postgresql://postgres@127.0.0.1:{port}/{db}"
WORK_KINDS = ("sleep", "cpu", "redis")
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


SYSTEMS = {
    s.name: s
    for s in [
        System("hivejobs", 8, needs_pg=True),
        System("rq", 1, ("rq==3.0.0", REDIS_PIN)),
        System("dramatiq", 2, ("dramatiq[redis]==2.2.1", REDIS_PIN)),
        System("celery", 3, ("celery[redis]==5.7.0", REDIS_PIN)),
        System("procrastinate", 4, ("procrastinate==3.10.0", REDIS_PIN), needs_pg=True),
        # typer pinned: pgqueuer 1.6.0's `pgq run` crashes on startup with typer 0.29
        System(
            "pgqueuer", 5, ("pgqueuer[asyncpg]==1.6.0", "typer==0.20.1", REDIS_PIN), needs_pg=True
        ),
        System("huey", 6, ("huey==3.5.4", REDIS_PIN)),
        # saq 0.26.4 imports typing_extensions without declaring it
        System("saq", 7, ("saq==0.26.4", "typing_extensions", REDIS_PIN)),
        # RQ's default forking Worker (a fork per job): opt-in, it is far slower
        System(
            "rq-fork", 9, ("rq==3.0.0", REDIS_PIN), venv="rq", driver="rq_driver.py", variant="fork"
        ),
    ]
}
DEFAULT_SYSTEMS = "hivejobs,rq,dramatiq,celery,procrastinate,pgqueuer,huey,saq"
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


def redis_cli(db: int, *args: str) -> str:
    assert db != 0, "db 0 is not ours"
    return sh(["redis-cli", "-h", REDIS_HOST, "-p", str(REDIS_PORT), "-n", str(db), *args])


def psql(sql: str, port: str = "") -> str:
    admin = ["psql", "-h", "127.0.0.1", "-p", port or PG_PORT[0], "-U", "postgres"]
    admin += ["-d", "postgres"]
    return sh(admin + ["-v", "ON_ERROR_STOP=1", "-tAc", sql])


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


def run_driver(system: System, py: str, jobs: int, timeout: float, work: tuple[str, float]) -> dict:
    """One isolated run: flush its Redis db, create its database, run the driver, clean up."""
    db_name = f"peers_{system.name.replace('-', '_').replace('@', '_')}_{os.getpid()}"
    port = system.pg_port or PG_PORT[0]
    cmd = [
        py,
        str(DRIVERS / (system.driver or f"{system.name}_driver.py")),
        "--jobs",
        str(jobs),
        "--timeout",
        str(timeout),
        "--redis-url",
        f"redis://{REDIS_HOST}:{REDIS_PORT}/{system.redis_db}",
    ]
    if system.needs_pg:
        cmd += ["--pg-url", PG_URL.format(port=port, db=db_name)]
    if system.variant:
        cmd += ["--variant", system.variant]
    redis_cli(system.redis_db, "FLUSHDB")
    if system.needs_pg:
        psql(f"DROP DATABASE IF EXISTS {db_name} WITH (FORCE)", port)
        psql(f"CREATE DATABASE {db_name}", port)
    with tempfile.TemporaryFile() as err:
        # own session: on timeout we SIGTERM the driver, whose finally stops its workers
        env = {**os.environ, "PEERS_WORK": work[0], "PEERS_WORK_MS": repr(work[1])}
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
                psql(f"DROP DATABASE IF EXISTS {db_name} WITH (FORCE)", port)
            redis_cli(system.redis_db, "FLUSHDB")
        lines = [ln for ln in out.decode().splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            err.seek(0)
            tail = err.read().decode(errors="replace")[-3000:]
            raise RuntimeError(f"driver exited {proc.returncode}\n{tail}")
    return json.loads(lines[-1])


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
    med = {k: runs[0][k] for k in ("system", "version", "keeps_jobs_in", "settings")}
    for key in METRICS:
        values = [r[key] for r in runs if r.get(key) is not None]
        med[key] = round(statistics.median(values), 2) if values else None
    med["runs"] = len(runs)
    return med


def environment() -> dict:
    """Versions that matter for reading the numbers later."""
    info = {
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
    }
    try:
        server = redis_cli(1, "INFO", "server")
        info["redis"] = next(
            ln.split(":", 1)[1].strip()
            for ln in server.splitlines()
            if ln.startswith("redis_version:")
        )
    except (subprocess.CalledProcessError, StopIteration, OSError) as exc:
        info["redis"] = f"unknown ({exc})"
    try:
        info["postgres"] = psql("SHOW server_version").strip()
    except (subprocess.CalledProcessError, OSError) as exc:
        info["postgres"] = f"unknown ({exc})"
    return info


def fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def print_table(medians: dict[str, dict], failures: dict[str, str]) -> None:
    base = (medians.get("hivejobs") or {}).get("throughput_per_s")
    header = [
        "system",
        "version",
        "keeps jobs in",
        "enqueue/s (single)",
        "bulk enqueue/s",
        "throughput/s (median)",
        "PG CPU ms/job",
        "worker CPU ms/job",
        "pickup p50 ms",
        "pickup p99 ms",
        "hivejobs / this",
    ]
    rows = []
    for name, m in medians.items():
        tp = m["throughput_per_s"]
        ratio = f"{base / tp:.2f}x" if base and tp else "-"
        rows.append(
            [
                name,
                m["version"],
                m["keeps_jobs_in"],
                fmt(m["enqueue_single_per_s"]),
                fmt(m["enqueue_bulk_per_s"]),
                fmt(tp),
                fmt(m.get("pg_cpu_ms_per_job"), 3),
                fmt(m.get("worker_cpu_ms_per_job"), 3),
                fmt(m["pickup_p50_ms"], 1),
                fmt(m["pickup_p99_ms"], 1),
                ratio,
            ]
        )
    for name, why in failures.items():
        rows.append([name, "-", why.splitlines()[0][:40], *["-"] * (len(header) - 3)])
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for i, row in enumerate([header, *rows]):
        print(" | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
        if i == 0:
            print("-+-".join("-" * w for w in widths))


def add_systems(names: list[str], sources: list[str], free_db: int = 10) -> None:
    """Systems made for this run: `NAME=SRC` (hivejobs from another tree) and `NAME@PORT`
    (a system on another Postgres, e.g. a cluster with autovacuum on), each on a Redis db of
    its own (--redis-db-from and up: two runs at once need apart ranges)."""
    trees = dict(src.split("=", 1) for src in sources if "=" in src)
    if len(trees) != len(sources):
        raise ValueError("--hivejobs-src takes NAME=SRC")
    for name in names:
        base, _, port = name.partition("@")
        if name in SYSTEMS:
            continue
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
    p.add_argument("--pg-port", default="5432", help="Postgres port on 127.0.0.1")
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
        default=10,
        help="first Redis db of the NAME@PORT and --hivejobs-src systems (default 10)",
    )
    args = p.parse_args()
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
    PG_PORT[0] = args.pg_port

    env = environment()
    print(
        f"python {env['python']}, redis {env['redis']}, postgres {env['postgres']} "
        f"(port {args.pg_port}, autovacuum {psql('SHOW autovacuum').strip()}), "
        f"{env['cpu_count']} cpus; jobs={args.jobs} repeats={args.repeats} work={args.work}",
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
    tables: dict[str, dict] = {}
    for ms in sweep:
        label = f"{args.work} {ms:g} ms"
        jobs = jobs_for(args.jobs, ms)
        timeout = args.timeout or max(120.0, jobs / 50)
        runs: dict[str, list[dict]] = {}
        failed: dict[str, str] = dict(failures)
        for i in range(args.repeats):
            for name in names:
                if name in failed:
                    continue
                t0 = time.monotonic()
                try:
                    result = run_driver(
                        SYSTEMS[name], pythons[name], jobs, timeout, (args.work, ms)
                    )
                except Exception as exc:  # one peer failing must not stop the others
                    failed[name] = f"failed: {exc}"
                    print(f"[{name}] {label} run {i + 1} FAILED: {exc}", flush=True)
                    continue
                if "unavailable" in result:
                    failed[name] = f"unavailable: {result['unavailable']}"
                    continue
                runs.setdefault(name, []).append(result)
                print(
                    f"[{name}] {label} run {i + 1}/{args.repeats} "
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
        print(f"\n{label}, {jobs:,} jobs per run, medians of {args.repeats}:")
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
