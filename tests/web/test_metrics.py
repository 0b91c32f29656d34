"""/metrics while a real `hivejobs run` works: the counters (kept in Redis by every forked pool
process) and gauges match what Postgres holds; the text parses as Prometheus exposition."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import Instance, free_port, pool_pids, sql, wait_until
from tests.web.conftest import Server

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str, headers: dict[str, str] | None = None) -> Samples:
    text = httpx.get(url, headers=headers, timeout=10).text
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def archived(url: str, name: str, state: str) -> int:
    rows = sql(
        url, "SELECT count(*) FROM hivejobs_archive WHERE name = %s AND state = %s", (name, state)
    )
    return int(rows[0][0])


def test_metrics_match_postgres_while_a_fleet_runs(
    server: Server, fleet: Callable[..., Instance], database_url: str
) -> None:
    port = free_port()
    instance = fleet(args=["--metrics-port", str(port)])
    run_metrics = f"http://127.0.0.1:{port}/metrics"
    c = server.client
    assert c.post("/v1/jobs/echo/batch", json={"data": [{"text": str(i)} for i in range(40)]})
    for _ in range(4):
        assert c.post("/v1/jobs/boom", json={"data": {}}).status_code == 201
    wait_until(
        lambda: (
            archived(database_url, "echo", "succeeded") == 40
            and archived(database_url, "boom", "failed") == 4
        ),
        what="40 echo jobs succeeded and 4 boom jobs failed",
    )

    def agrees(url: str, headers: dict[str, str] | None = None) -> Samples | None:
        try:
            m = scrape(url, headers)
        except httpx.HTTPError:
            return None
        expected = {
            ("hivejobs_jobs_succeeded_total", "echo"): archived(database_url, "echo", "succeeded"),
            ("hivejobs_jobs_failed_total", "boom"): archived(database_url, "boom", "failed"),
            ("hivejobs_jobs_retried_total", "boom"): 4,  # attempts=2: one retry each
            ("hivejobs_job_run_seconds_count", "echo"): 40,
            ("hivejobs_job_run_seconds_count", "boom"): 8,
            ("hivejobs_job_pickup_seconds_count", "echo"): 40,
            ("hivejobs_job_pickup_seconds_count", "boom"): 8,
        }
        if all(value(m, n, job_type=t) == v for (n, t), v in expected.items()):
            return m
        return None

    samples = wait_until(lambda: agrees(run_metrics), what="run --metrics-port to agree")
    assert value(samples, "hivejobs_job_run_seconds_bucket", job_type="echo", le="+Inf") == 40
    assert value(samples, "hivejobs_jobs_queued", job_type="echo") == 0
    assert value(samples, "hivejobs_jobs_running", job_type="echo") == 0
    assert value(samples, "hivejobs_worker_processes", role="pool") == 4
    leader = [k for k in samples if k[0] == "hivejobs_coordinator_leader"]
    assert len(leader) == 1 and samples[leader[0]] == 1
    # The served app's /metrics shows the same fleet-wide numbers.
    served = wait_until(lambda: agrees(server.url + "/metrics", dict(c.headers)))
    assert value(served, "hivejobs_jobs_succeeded_total", job_type="echo") == 40

    # A pool killed mid-job: the supervisor puts its job back at once, counted as rescued.
    slow = c.post("/v1/jobs/echo", json={"data": {"text": "slow", "n": 60000}}).json()["id"]
    wait_until(lambda: c.get(f"/v1/jobs/echo/{slow}").json()["state"] == "running")
    (pid,) = pool_pids(database_url, "echo")
    os.kill(pid, signal.SIGKILL)
    wait_until(
        lambda: value(scrape(run_metrics), "hivejobs_jobs_rescued_total", job_type="echo") == 1,
        what="the rescue counted",
    )
    assert sql(database_url, "SELECT lost FROM hivejobs_job WHERE id = %s", (slow,)) == [(1,)]

    # Queue depth and in-flight come from Postgres at scrape time; a graceful stop suspends.
    held = c.post("/v1/jobs/hold", json={"data": {}}).json()["id"]
    wait_until(lambda: c.get(f"/v1/jobs/hold/{held}").json()["state"] == "running")
    # Postgres' part is reused for probe_cache_s: it shows the running job within that.
    wait_until(
        lambda: value(scrape(run_metrics), "hivejobs_jobs_running", job_type="hold") == 1,
        what="the held job counted as running",
    )
    instance.signal_group(signal.SIGTERM)
    assert instance.wait(30) == 0
    assert c.get(f"/v1/jobs/hold/{held}").json()["state"] == "queued"
    after = scrape(server.url + "/metrics", dict(c.headers))
    assert value(after, "hivejobs_jobs_suspended_total", job_type="hold") == 1
    assert value(after, "hivejobs_jobs_queued", job_type="hold") == 1
