"""Many hosts, simulated: N `hivejobs run` instances, each in a network namespace
of its own, reach Postgres and Redis over a veth link with an added round-trip time, as
instances in other availability zones would. Per link: drain throughput, pickup p50/p99 and
leader failover time after `kill -9` of the leading instance, beside the same instances on
loopback, rounds of every link interleaved so each median comes from the same minutes.

    python bench/multihost.py [--instances 3] [--links loopback,0,1,5] [--repeats 3] [--json F]
    python bench/multihost.py --report F     # the table of a saved run again

Needs root (`ip netns`, veth). The delay is NOT `tc netem`: this kernel has no netem
(CONFIG_NET_SCH_NETEM is not set, CONFIG_MODULES is not set), so a userspace proxy
(bench/delayproxy.py) on the host end of the veth links adds half the RTT per direction and
forwards to the servers on 127.0.0.1 (they listen there only, which a namespace cannot
reach); it runs under SCHED_FIFO so that its delay holds on this shared, loaded machine.
Link "0" is the same path with no delay: the proxy's own cost. The round trips each row
really had are measured from inside a namespace (Redis PING, Postgres `SELECT 1`, the probe
also under SCHED_FIFO) before the instances start, and reported beside the nominal RTT.

The job body is `hivejobs.bench.benchapp:bench_noop` (no work, empty payload, or {"t": ...} for
pickup), `--processes` x `--concurrency` per instance; the clients that enqueue run on the
host (loopback to the servers, as a web app next to the database). Lease settings are the
production defaults unless --lease-ttl-s / --lease-renew-s say otherwise. Everything made
here (namespaces, veth pairs, proxies, instances, the bench database, Redis keys, temp dir)
is removed at the end, also on Ctrl-C, SIGTERM or failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "src"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from bench.netns import Network, Proxies, reap  # noqa: E402
from psycopg.conninfo import conninfo_to_dict, make_conninfo  # noqa: E402

from hivejobs.bench.environment import BenchEnvironment, set_stop_signals  # noqa: E402
from hivejobs.bench.percentiles import percentiles  # noqa: E402

JOB = "bench_noop"
LOOPBACK = "loopback"

# Run inside a namespace (or on the host for loopback): median round trips before the
# instances start. Under SCHED_FIFO, as the proxy: the link's RTT, not this machine's load.
RTT_PROBE = """
import json, os, statistics, sys, time
import psycopg, redis
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
def median_ms(call):
    call()
    xs = []
    for _ in range(200):
        t = time.perf_counter(); call(); xs.append(time.perf_counter() - t)
    return statistics.median(xs) * 1000
r = redis.Redis.from_url(sys.argv[2])
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    pg = median_ms(lambda: conn.execute("SELECT 1").fetchall())
print(json.dumps({"redis_rtt_ms": median_ms(r.ping), "pg_rtt_ms": pg}))
"""


class Fleet:
    """The instances of one round, on one link. Owns their processes; close() ends them."""

    def __init__(
        self, env: BenchEnvironment, args: argparse.Namespace, network: Network | None
    ) -> None:
        self.env = env
        self.procs: list[subprocess.Popen[bytes]] = []
        try:
            self._start(args, network)
            self._wait_ready(args.instances * args.processes, args.instances)
        except BaseException:
            self.close(signal.SIGKILL)  # interrupted or failed half-way: the started ones go
            raise

    def _start(self, args: argparse.Namespace, network: Network | None) -> None:
        env = self.env
        for i in range(args.instances):
            urls = via(env, network.host_address(i)) if network else via(env, None)
            variables = dict(os.environ) | {
                "HIVEJOBS_DATABASE_URL": urls[0],
                "HIVEJOBS_REDIS_URL": urls[1],
                "HIVEJOBS_PREFIX": env.prefix,
                "HIVEJOBS_BENCH_PROCESSES": str(args.processes),
                "HIVEJOBS_BENCH_CONCURRENCY": str(args.concurrency),
                "HIVEJOBS_BENCH_WORK_MS": "0",
                "HIVEJOBS_BENCH_DIR": str(env.workdir),
                "HIVEJOBS_LEASE_TTL_S": str(args.lease_ttl_s),
                "HIVEJOBS_LEASE_RENEW_S": str(args.lease_renew_s),
                "HIVEJOBS_LOG_LEVEL": os.environ.get("HIVEJOBS_LOG_LEVEL", "WARNING"),
                "PYTHONPATH": str(ROOT / "src"),
            }
            cmd = [sys.executable, "-m", "hivejobs", "run", "hivejobs.bench.benchapp:app"]
            cmd += ["--shutdown-timeout", "5"]
            if network:  # `ip netns exec` execs the command: the pid stays the instance's
                cmd = ["ip", "netns", "exec", network.namespaces[i], *cmd]
            with open(env.workdir / f"instance{i}.log", "ab") as log:
                self.procs.append(
                    subprocess.Popen(
                        cmd,
                        env=variables,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def _wait_ready(self, pools: int, coordinators: int) -> None:
        deadline = time.monotonic() + 60
        while True:
            row = self.env.sql(
                "SELECT count(*) FILTER (WHERE role = 'pool' AND pool = %s), "
                "count(*) FILTER (WHERE role = 'coordinator'), "
                "(SELECT count(*) FROM hivejobs_leader WHERE expires_at > now()) "
                "FROM hivejobs_worker",
                (JOB,),
            )[0]
            if row[0] >= pools and row[1] >= coordinators and row[2]:
                return
            dead = [i for i, p in enumerate(self.procs) if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(
                    f"instances not ready ({row}); see {self.env.workdir}/instance{dead}.log"
                )
            time.sleep(0.05)  # polling the workers table for readiness

    def close(self, sig: int = signal.SIGTERM) -> None:
        """All instances are signalled first, then waited for: they stop side by side."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
        for proc in self.procs:
            reap(proc)  # once each: a second SIGTERM means "hurry" to a supervisor


def via(env: BenchEnvironment, address: str | None) -> tuple[str, str]:
    """The database and Redis URLs an instance uses: the servers' own, or the same servers'
    ports on a namespace's host address (where the proxies listen)."""
    if address is None:
        return env.database_url, env.redis_url
    parts = urlsplit(env.redis_url)
    netloc = parts.netloc.rpartition("@")
    auth = netloc[0] + "@" if netloc[0] else ""
    redis_url = urlunsplit(parts._replace(netloc=f"{auth}{address}:{parts.port or 6379}"))
    return make_conninfo(env.database_url, host=address), redis_url


def targets(env: BenchEnvironment) -> list[tuple[str, int]]:
    pg = conninfo_to_dict(env.database_url)
    redis_parts = urlsplit(env.redis_url)
    return [
        (str(pg.get("hostaddr") or pg.get("host") or "127.0.0.1"), int(pg.get("port") or 5432)),
        (redis_parts.hostname or "127.0.0.1", redis_parts.port or 6379),
    ]


def probe_rtt(env: BenchEnvironment, network: Network | None) -> dict[str, float]:
    urls = via(env, network.host_address(0) if network else None)
    cmd = [sys.executable, "-c", RTT_PROBE, *urls]
    if network:
        cmd = ["ip", "netns", "exec", network.namespaces[0], *cmd]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60).stdout
    return {k: float(v) for k, v in json.loads(out).items()}


def pickup(env: BenchEnvironment, jobs: int, rate: float) -> dict[str, float]:
    """Paced single enqueues against idle instances: enqueue call to handler start."""
    assert env.app is not None
    begin = time.perf_counter()
    ids = []
    for i in range(jobs):
        pause = begin + i / rate - time.perf_counter()
        if pause > 0:
            time.sleep(pause)  # pacing the load generator, not synchronisation
        ids.append(env.app.enqueue(JOB, {"t": time.time()}))
    wait_archived(env, ids)
    values = sorted(env.latencies_us())
    for path in env.workdir.glob("latency.*"):
        # Emptied, not removed: each pool process keeps its file open (O_APPEND).
        os.truncate(path, 0)
    if len(values) != jobs:
        raise RuntimeError(f"pickup: {len(values)} latencies for {jobs} jobs")
    p50, p99 = percentiles(values, 50, 99)
    return {"pickup_p50_ms": p50 / 1000, "pickup_p99_ms": p99 / 1000}


def drain(env: BenchEnvironment, jobs: int) -> dict[str, float]:
    """A backlog enqueued in one go while the instances run: first to last finish."""
    assert env.app is not None
    ids: list[str] = []
    for offset in range(0, jobs, 10_000):
        ids += env.app.enqueue_many(JOB, [{}] * min(10_000, jobs - offset))
    wait_archived(env, ids)
    first, last = env.sql(
        "SELECT extract(epoch FROM min(finished_at)), extract(epoch FROM max(finished_at)) "
        "FROM hivejobs_archive WHERE id = ANY(%s)",
        (ids,),
    )[0]
    return {"throughput_jobs_per_s": (jobs - 1) / max(float(last) - float(first), 1e-6)}


def wait_archived(env: BenchEnvironment, ids: list[str], timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        done = env.sql(
            "SELECT count(*) FROM hivejobs_archive WHERE id = ANY(%s) AND state = 'succeeded'",
            (ids,),
        )[0][0]
        if done == len(ids):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{done}/{len(ids)} jobs succeeded in {timeout_s:.0f} s")
        time.sleep(0.05)  # polling the archive for the end of a drain


def failover(env: BenchEnvironment, fleet: Fleet, lease_ttl_s: float) -> dict[str, float]:
    """kill -9 of the whole leading instance (its process group); then the new term's
    acquired_at (database clock, the same host clock as ours) against the kill and against
    the dead lease's expiry."""
    holder_pid, term = env.sql(
        "SELECT w.pid, l.term FROM hivejobs_leader l JOIN hivejobs_worker w ON w.id = l.holder "
        "WHERE l.expires_at > now()"
    )[0]
    supervisor = parent_pid(int(holder_pid))
    leading = next(p for p in fleet.procs if p.pid == supervisor)
    os.killpg(leading.pid, signal.SIGKILL)
    killed_at = time.time()
    leading.wait(10)
    # Read after the kill: a renewal that committed just before it is the one that counts.
    expires = float(env.sql("SELECT extract(epoch FROM expires_at) FROM hivejobs_leader")[0][0])
    deadline = time.monotonic() + lease_ttl_s + 30
    while True:
        row = env.sql(
            "SELECT term, extract(epoch FROM acquired_at) FROM hivejobs_leader "
            "WHERE term > %s AND expires_at > now()",
            (term,),
        )
        if row:
            acquired = float(row[0][1])
            return {
                "failover_s": acquired - killed_at,
                "takeover_after_expiry_s": acquired - expires,
            }
        if time.monotonic() > deadline:
            raise RuntimeError("no new leader after the kill")
        time.sleep(0.02)  # polling the lease row; acquired_at is the figure, not this loop


def parent_pid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[1])


def reset(env: BenchEnvironment) -> None:
    """Between rounds, with no instance running: no jobs, no workers, no lease. The boot
    marker stays, so the next coordinator does not take empty lists for a flushed Redis."""
    env.sql("TRUNCATE hivejobs_job, hivejobs_archive")
    env.sql("DELETE FROM hivejobs_worker")
    env.sql("DELETE FROM hivejobs_leader")
    env.clear_redis(keep_boot_marker=True)
    for path in env.workdir.glob("latency.*"):
        path.unlink()


def run_round(
    env: BenchEnvironment, args: argparse.Namespace, link: str, network: Network | None
) -> dict[str, float]:
    proxies = None
    fleet = None
    try:
        if link != LOOPBACK:
            assert network is not None
            proxies = Proxies(network, float(link) / 2, targets(env))
        figures = probe_rtt(env, network if proxies else None)
        fleet = Fleet(env, args, network if proxies else None)
        # The drain first: pickup is measured on warm instances (connections, statements).
        figures |= drain(env, args.jobs)
        figures |= pickup(env, args.pickup_jobs, args.pickup_rate)
        figures |= failover(env, fleet, args.lease_ttl_s)
        return figures
    finally:
        ending = sys.exc_info()[0] is not None
        if ending:
            set_stop_signals(signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        if fleet:
            # Ending on an error or a signal: no graceful shutdown, the database goes anyway.
            fleet.close(signal.SIGKILL if ending else signal.SIGTERM)
        if proxies:
            proxies.close()
        reset(env)


def medians(rounds: list[dict[str, Any]], links: list[str]) -> dict[str, dict[str, float]]:
    """Per link, the median of each figure, and the medians of its per-repeat comparisons
    with loopback and with the undelayed proxy ("0"): the rounds of one repeat ran in the
    same minutes, so a comparison inside a repeat is steadier than one of medians."""
    out: dict[str, dict[str, float]] = {}
    for link in links:
        mine = [r for r in rounds if r["link"] == link]
        if not mine:
            continue
        out[link] = {
            k: statistics.median(r["figures"][k] for r in mine) for k in mine[0]["figures"]
        }
        for base_link, name in ((LOOPBACK, "loopback"), ("0", "proxy_0ms")):
            base = {r["repeat"]: r["figures"] for r in rounds if r["link"] == base_link}
            pairs = [(r["figures"], base[r["repeat"]]) for r in mine if r["repeat"] in base]
            if link in (base_link, LOOPBACK) or not pairs:
                continue
            out[link][f"throughput_vs_{name}"] = statistics.median(
                f["throughput_jobs_per_s"] / b["throughput_jobs_per_s"] for f, b in pairs
            )
            out[link][f"pickup_p50_added_vs_{name}_ms"] = statistics.median(
                f["pickup_p50_ms"] - b["pickup_p50_ms"] for f, b in pairs
            )
    return out


def link_name(link: str) -> str:
    return "loopback, host namespace" if link == LOOPBACK else f"netns, +{link} ms RTT (proxy)"


def markdown(result: dict[str, Any]) -> str:
    def opt(m: dict[str, float], key: str, fmt: str) -> str:
        return format(m[key], fmt) if key in m else "-"

    rows = [
        "| link | measured RTT Redis / PG (ms) | throughput (jobs/s) | vs loopback | vs +0 ms "
        "| pickup p50 / p99 (ms) | p50 added vs loopback (ms) | failover after kill -9 (s) "
        "| takeover after lease expiry (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for link, m in result["medians"].items():
        rows.append(
            f"| {link_name(link)} | {m['redis_rtt_ms']:.2f} / {m['pg_rtt_ms']:.2f} "
            f"| {m['throughput_jobs_per_s']:,.0f} | {opt(m, 'throughput_vs_loopback', '.2f')} "
            f"| {opt(m, 'throughput_vs_proxy_0ms', '.2f')} "
            f"| {m['pickup_p50_ms']:.1f} / {m['pickup_p99_ms']:.1f} "
            f"| {opt(m, 'pickup_p50_added_vs_loopback_ms', '+.1f')} "
            f"| {m['failover_s']:.1f} | {m['takeover_after_expiry_s']:.2f} |"
        )
    return "\n".join(rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--instances", type=int, default=3)
    p.add_argument("--processes", type=int, default=1, help="bench_noop pool processes each")
    p.add_argument("--concurrency", type=int, default=8, help="threads per pool process")
    p.add_argument("--links", default="loopback,0,1,5", help="loopback and/or RTTs in ms")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--jobs", type=int, default=10_000, help="backlog drained per round")
    p.add_argument("--pickup-jobs", type=int, default=600)
    p.add_argument("--pickup-rate", type=float, default=200.0, help="paced enqueues per s")
    p.add_argument("--lease-ttl-s", type=float, default=15.0)
    p.add_argument("--lease-renew-s", type=float, default=5.0)
    p.add_argument(
        "--database-url",
        default=os.environ.get("HIVEJOBS_DATABASE_URL", "postgresql://127.0.0.1:5432/postgres"),
    )
    p.add_argument(
        "--redis-url", default=os.environ.get("HIVEJOBS_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    args.links = [s.strip() for s in args.links.split(",") if s.strip()]
    for link in args.links:
        if link != LOOPBACK:
            try:
                ok = float(link) >= 0
            except ValueError:
                ok = False
            if not ok:
                p.error(f"--links: {link!r} is neither 'loopback' nor an RTT in ms >= 0")
    for name in ("instances", "processes", "concurrency", "repeats", "jobs", "pickup_jobs"):
        if getattr(args, name) < (2 if name == "instances" else 1):
            p.error(
                f"--{name.replace('_', '-')} must be at least {2 if name == 'instances' else 1}"
            )
    if os.geteuid() != 0:
        p.error("needs root: it creates network namespaces and veth pairs")
    return args


def report(path: str) -> None:
    """The table of a saved run, its medians computed again from its rounds."""
    result = json.loads(Path(path).read_text())
    links = list(dict.fromkeys(r["link"] for r in result["rounds"]))
    result["medians"] = medians(result["rounds"], links)
    print(markdown(result))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--report"] and len(argv) == 2:
        report(argv[1])
        return {}
    args = parse_args(argv)
    # SIGTERM ends the run as Ctrl-C does, through every `finally` below; SIGINT too when the
    # run was started with it ignored (a script's background job).
    set_stop_signals(signal.default_int_handler)
    run_id = uuid.uuid4().hex[:6]
    rounds: list[dict[str, Any]] = []
    network = (
        Network(args.instances, run_id) if any(link != LOOPBACK for link in args.links) else None
    )
    started = time.time()
    error = None
    try:
        with BenchEnvironment(args.database_url, args.redis_url) as env:
            # What this run makes, for whoever checks that it is gone afterwards.
            made = f"database {env.dbname}, Redis prefix {env.prefix}"
            if network:
                made += f", namespaces {' '.join(network.namespaces)}"
                made += f", links {' '.join(network.host_links)}"
            print(f"multihost: {made}", file=sys.stderr, flush=True)
            if network:
                network.open()
            for repeat in range(args.repeats):
                for link in args.links:
                    print(f"repeat {repeat + 1}/{args.repeats}: {link_name(link)}", file=sys.stderr)
                    figures = run_round(env, args, link, network)
                    print(
                        f"  {json.dumps({k: round(v, 3) for k, v in figures.items()})}",
                        file=sys.stderr,
                    )
                    rounds.append({"repeat": repeat, "link": link, "figures": figures})
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        set_stop_signals(signal.SIG_IGN)
        failed = network.close() if network else []
        for line in failed:
            print(f"multihost: could not clean up: {line}", file=sys.stderr)
        result = {
            "job_body": f"hivejobs.bench.benchapp:{JOB}, no work",
            "options": {k: v for k, v in vars(args).items() if not k.endswith("_url")},
            "delay": "userspace proxy bench/delayproxy.py (no netem in this kernel)",
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
            "wall_s": time.time() - started,
            "loadavg": os.getloadavg(),
            "error": error,  # a failed run keeps the rounds it finished
            "rounds": rounds,
            "medians": medians(rounds, args.links),
        }
        if rounds:
            print(markdown(result))
        if args.json and (rounds or error):
            Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
