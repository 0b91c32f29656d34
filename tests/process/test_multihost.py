"""bench/multihost.py in a short mode: instances in network namespaces behind the delay proxy
really pay the round trip, a kill -9 of the leading instance hands the lease over only after
it expired, and the script leaves nothing behind, also when interrupted (never its timings
beyond what the delay makes certain)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.harness import REDIS_URL, ROOT, alive, sql, wait_until

SCRIPT = ROOT / "bench" / "multihost.py"
RTT_MS = 4.0

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="needs root and iproute2: it creates network namespaces and veth pairs",
)


def leftovers(admin_url: str) -> dict[str, set[str]]:
    """What the script could leave behind: namespaces, host-side links, bench databases,
    Redis keys. Compared before and after (other sessions may hold some of their own)."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return {
        "netns": {line.split()[0] for line in netns.splitlines() if line.startswith("hjmh-")},
        "links": {
            line.split(":")[1].strip().split("@")[0]
            for line in links.splitlines()
            if ": hjmh" in line
        },
        "databases": {
            r[0]
            for r in sql(
                admin_url, "SELECT datname FROM pg_database WHERE datname LIKE 'hivejobs_bench%'"
            )
        },
        "redis": {
            k.decode() for k in redis.Redis.from_url(REDIS_URL).scan_iter(match="hivejobs-bench:*")
        },
    }


def short_run(*extra: str) -> list[str]:
    return [
        sys.executable,
        str(SCRIPT),
        "--instances",
        "2",
        "--links",
        str(RTT_MS),
        "--repeats",
        "1",
        "--pickup-rate",
        "100",
        "--lease-ttl-s",
        "2",
        "--lease-renew-s",
        "0.5",
        *extra,
    ]


@pytest.mark.timeout(90)
def test_short_run_pays_the_round_trip_and_leaves_nothing(admin_url: str, tmp_path: Path) -> None:
    before = leftovers(admin_url)
    out = tmp_path / "multihost.json"
    proc = subprocess.run(
        short_run("--jobs", "300", "--pickup-jobs", "40", "--json", str(out)),
        capture_output=True,
        text=True,
        timeout=80,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    figures = result["medians"][str(RTT_MS)]
    # The proxy can only add to a round trip: measured from inside a namespace it is at
    # least the RTT asked for.
    assert figures["redis_rtt_ms"] >= RTT_MS and figures["pg_rtt_ms"] >= RTT_MS, figures
    # A job's pickup crosses the link at least three times one way: the BLMPOP's reply, then
    # the claim's UPDATE and its reply.
    assert figures["pickup_p50_ms"] >= 1.5 * RTT_MS, figures
    assert figures["pickup_p99_ms"] >= figures["pickup_p50_ms"] > 0
    assert figures["throughput_jobs_per_s"] > 0
    # A new term after the kill, and never before the dead leader's lease expired.
    assert 0 < figures["takeover_after_expiry_s"] < figures["failover_s"] <= 2 + 5, figures
    assert "| netns, +4.0 ms RTT (proxy) |" in proc.stdout
    assert leftovers(admin_url) == before


@pytest.mark.timeout(90)
def test_interrupted_run_removes_namespaces_instances_and_proxies(admin_url: str) -> None:
    before = leftovers(admin_url)
    proc = subprocess.Popen(
        short_run("--jobs", "1000000"),  # still enqueueing or draining when interrupted
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
    )
    try:
        namespaces: set[str] = set()

        def instances_up() -> bool:
            namespaces.update(leftovers(admin_url)["netns"] - before["netns"])
            return len(namespaces) == 2 and all(pids_in(ns) for ns in namespaces)

        wait_until(instances_up, timeout=60, what="instances running in both namespaces")
        inside = {pid for ns in namespaces for pid in pids_in(ns)}
        proxies = children_running(proc.pid, "delayproxy.py")
        assert len(proxies) == 2
        proc.send_signal(signal.SIGINT)
        assert proc.wait(45) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    # SIGKILLed pool processes of an instance may take a moment to die and be reaped.
    wait_until(lambda: not [p for p in inside | proxies if alive(p)], timeout=10, what="gone")
    assert leftovers(admin_url) == before


def pids_in(namespace: str) -> set[int]:
    out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    return {int(p) for p in out.stdout.split()}


def children_running(parent: int, needle: str) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(") ", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and needle.encode() in cmdline:
            found.add(int(stat.parent.name))
    return found
