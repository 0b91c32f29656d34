"""A real `hivejobs run` on Redis Sentinel and on a Redis Cluster of the test's own.

Sentinel: the master is killed (kill -9) mid-run; the sentinels promote the replica and
hivejobs follows within seconds; the old master comes back empty and is demoted, and nothing
stalls. Cluster: types whose lists live on different nodes, a chain, and one node flushed
mid-run (the reconciler repairs per list, whichever node holds it). 0 lost and no
at-most-once job run twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from hivejobs import App, Chain
from hivejobs.broker.clients import sync_client
from tests.harness import (
    Instance,
    fleet_app,
    ledger_oks,
    ledger_starts,
    live_jobs,
    read_ledger,
    wait_until,
)
from tests.servers import RedisClusterSet, RedisSentinelSet


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[RedisSentinelSet]:
    servers = RedisSentinelSet(tmp_path / "sentinel")
    yield servers
    servers.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RedisClusterSet]:
    servers = RedisClusterSet(tmp_path / "cluster")
    yield servers
    servers.stop()


def started_after(ledger_dir: Path, ids: list[str]) -> dict[str, int]:
    wanted = set(ids)
    return {p[1]: int(p[4]) for p in read_ledger(ledger_dir) if p[0] == "start" and p[1] in wanted}


def test_sentinel_master_killed_and_returning_empty(
    sentinels: RedisSentinelSet,
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    redis_prefix: str,
    ledger_dir: Path,
) -> None:
    start_instance({"HIVEJOBS_REDIS_URL": sentinels.url, "HJ_TYPES": "alo,amo"})
    app = fleet_app(make_app, database_url, ["alo", "amo"], redis_url=sentinels.url)
    alo = app.enqueue_many("alo", [{"ms": 5}] * 1200)
    amo = app.enqueue_many("amo", [{"ms": 5}] * 300)
    wait_until(lambda: len(ledger_oks(ledger_dir)) >= 100, what="some jobs done")
    old_master = sentinels.master
    assert sentinels.master_port() == old_master.port
    old_master.kill()
    killed_ns = time.monotonic_ns()
    # Jobs enqueued during the failover: acknowledged by Postgres, run once Redis is back.
    during = [app.enqueue("alo", {"ms": 1}) for _ in range(20)]
    first = wait_until(
        lambda: (s := started_after(ledger_dir, during)) and min(s.values()),
        timeout=30,
        what="a job enqueued after the kill to run",
    )
    stall_s = (first - killed_ns) / 1e9
    wait_until(lambda: sentinels.master_port() == sentinels.replica.port, what="promotion")
    # The old master returns empty: the sentinels make it a replica; hivejobs never writes
    # to it, so its empty lists cost nothing and nothing stalls.
    old_master.start()
    after = app.enqueue_many("alo", [{"ms": 1}] * 200)
    returned_ns = time.monotonic_ns()
    last = wait_until(
        lambda: len(s := started_after(ledger_dir, after)) == len(after) and max(s.values()),
        timeout=30,
        what="jobs enqueued after the old master returned",
    )
    wait_until(lambda: live_jobs(database_url) == 0, timeout=60, what="all jobs finished")
    oks = ledger_oks(ledger_dir)
    assert [i for i in alo + during + after if oks[i] < 1] == []
    starts = ledger_starts(ledger_dir)
    assert [i for i in amo if starts[i] != 1] == []
    print(
        f"\nsentinel failover: first pickup {stall_s:.1f} s after the master's kill -9; "
        f"200 jobs after the old master returned all started in "
        f"{(last - returned_ns) / 1e9:.1f} s"
    )
    assert stall_s < 15
    returned = redis.Redis(port=old_master.port, socket_timeout=1)
    try:
        if returned.info("replication").get("role") == "master":
            # Not yet demoted: hivejobs wrote nothing there (it follows the sentinels).
            assert list(returned.scan_iter(match=redis_prefix + "*")) == []
        # The sentinels demote it after their role-mismatch wait (about 8 s, more when the
        # machine is busy).
        wait_until(
            lambda: returned.info("replication").get("role") == "slave",
            timeout=40,
            what="the old master demoted",
        )
    finally:
        returned.close()


def test_cluster_types_on_several_nodes_chain_and_a_node_flushed(
    cluster: RedisClusterSet,
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    redis_prefix: str,
    ledger_dir: Path,
) -> None:
    env = {"HIVEJOBS_REDIS_URL": cluster.url}
    start_instance({**env, "HJ_TYPES": "alo,amo"})
    start_instance(env, app_spec="tests.apps.chainapp:app")
    app = fleet_app(make_app, database_url, ["alo", "amo", "step"], redis_url=cluster.url)
    nodes = {
        n: cluster.node_of(app.connections.broker.queue_key(n, 0)).port
        for n in ("alo", "amo", "step")
    }
    assert len(set(nodes.values())) >= 2, nodes  # the types' lists live on several nodes
    from tests.apps.chainapp import app as chain_types

    app.types.update(chain_types.types)
    chain = Chain("fan")
    heads = [chain.job("step", {"n": i, "ms": 5}, key=f"s{i}") for i in range(20)]
    chain.job("merge", {"expect": 20}, key="m", after=heads)
    request_id = app.run_chain(chain)
    alo = app.enqueue_many("alo", [{"ms": 5}] * 1000)
    amo = app.enqueue_many("amo", [{"ms": 5}] * 300)
    wait_until(lambda: len(ledger_oks(ledger_dir)) >= 50, what="some jobs done")
    # One node loses everything (a restart without persistence): only its lists go.
    flushed = sync_client(f"redis://127.0.0.1:{nodes['alo']}/0", socket_timeout=2)
    flushed.flushall()
    flushed.close()
    wait_until(lambda: live_jobs(database_url) == 0, timeout=60, what="all jobs finished")
    assert app.chain_status(request_id).state == "succeeded"
    oks = ledger_oks(ledger_dir)
    assert [i for i in alo + amo if oks[i] < 1] == []
    starts = ledger_starts(ledger_dir)
    assert [i for i in amo if starts[i] != 1] == []
    chain_starts = [k for k, n in starts.items() if k.startswith(request_id) and n > 1]
    assert chain_starts == []
