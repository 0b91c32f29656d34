"""Pure parts of the web layer and the metrics: token roles, keyset cursors, the DAG layout,
the Prometheus text, and the recorder keeping increments across a failed flush."""

from __future__ import annotations

from datetime import UTC, datetime

import fakeredis
import msgspec
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from hivejobs.broker import Broker
from hivejobs.config import Settings
from hivejobs.errors import ConfigError
from hivejobs.metrics import BUCKETS, Recorder, _bucket
from hivejobs.records.chains import ChainJobState, ChainJobStatus
from hivejobs.records.fleet import WorkerInfo
from hivejobs.records.jobs import ClaimedJob, Completion
from hivejobs.store.dashboard import EPOCH, FAR_FUTURE, decode_cursor, encode_cursor
from hivejobs.web.auth import Sessions, Throttle, Tokens, bearer, check_tokens, parse_tokens
from hivejobs.web.render import dag
from hivejobs.web.schemas import LeaderOut, WorkerOut
from hivejobs.web.shield import allowed_hosts, host_name, refuse_cross_site, refuse_host
from hivejobs.worker.metrics_server import render_counters


def test_token_roles() -> None:
    tokens = Tokens(read=("r1", "r2"), admin=("a1",))
    assert [tokens.role_of(t) for t in ("a1", "r2", "r1", "nope", "", None)] == [
        "admin",
        "read",
        "read",
        None,
        None,
        None,
    ]
    assert Tokens().open and Tokens().role_of(None) == "admin"
    assert parse_tokens(" a, ,b ") == ("a", "b") and parse_tokens(None) == ()
    assert bearer("Bearer xyz") == "xyz" and bearer("bearer  xyz ") == "xyz"
    assert bearer("Basic xyz") is None and bearer("Bearer ") is None and bearer(None) is None


def test_tokens_shorter_than_20_characters_are_refused_by_name() -> None:
    assert check_tokens(["x" * 20], "admin_tokens") == ("x" * 20,)
    with pytest.raises(ConfigError, match="HIVEJOBS_READ_TOKENS: a token of 19 characters"):
        check_tokens(["x" * 20, "y" * 19], "HIVEJOBS_READ_TOKENS")


def test_sessions_are_signed_and_expire() -> None:
    sessions = Sessions(lifetime_s=60)
    cookie = sessions.issue("read", now=1000.0)
    assert sessions.role_of(cookie, now=1059.0) == "read"
    assert sessions.role_of(cookie, now=1060.0) is None  # expired
    role, expires, nonce, mac = cookie.split(".")
    assert sessions.role_of(f"admin.{expires}.{nonce}.{mac}", now=1000.0) is None
    assert sessions.role_of(f"{role}.9999999999.{nonce}.{mac}", now=1000.0) is None
    assert Sessions(lifetime_s=60).role_of(cookie, now=1000.0) is None  # another secret
    for garbage in ("", "a.b.c", "a.b.c.d.e", None):
        assert sessions.role_of(garbage) is None


def test_throttle_blocks_after_failures_in_a_window_and_stays_bounded() -> None:
    now = [0.0]
    throttle = Throttle(
        max_failures=3, window_s=10, block_s=30, max_clients=5, clock=lambda: now[0]
    )
    assert [throttle.failed("a") for _ in range(3)] == [False, False, True]
    assert throttle.retry_after("a") == 30 and throttle.retry_after("b") is None
    now[0] = 29.5
    assert throttle.retry_after("a") == 1
    now[0] = 30.0
    assert throttle.retry_after("a") is None
    # Failures further apart than the window never block.
    for _ in range(5):
        now[0] += 11
        assert not throttle.failed("slow")
    for n in range(100):
        throttle.failed(f"client-{n}")
    assert len(throttle) == 5
    # An IPv6 host rotating through its /64 is one client.
    assert [throttle.failed(f"2001:db8:0:1::{n:x}") for n in range(3)] == [False, False, True]
    assert throttle.retry_after("2001:db8:0:1:ffff::1") == 30
    assert throttle.retry_after("2001:db8:0:2::1") is None
    assert [throttle.failed("192.0.2.7") for _ in range(3)] == [False, False, True]
    assert throttle.retry_after("::ffff:192.0.2.7") == 30 and not throttle.retry_after("192.0.2.8")


def test_host_and_origin_rules() -> None:
    assert host_name("[::1]:8080") == "::1" and host_name("Jobs.Example.:80") == "jobs.example"
    open_hosts = allowed_hosts([], open_mode=True)
    for ok in ("127.0.0.1:1", "localhost", "a.localhost", "[::1]:9", "127.3.4.5"):
        assert refuse_host(ok, open_hosts) is None, ok
    for bad in ("evil.example", "localhost.evil.example", "10.0.0.1", "0.0.0.0:80"):
        assert refuse_host(bad, open_hosts), bad
    assert allowed_hosts([], open_mode=False) is None
    assert refuse_host("a.b.example", allowed_hosts([".b.example"], open_mode=False)) is None
    here = "127.0.0.1:8080"
    assert refuse_cross_site("GET", here, "http://evil.example", "cross-site") is None
    assert refuse_cross_site("POST", here, None, None) is None  # curl
    assert refuse_cross_site("POST", here, "http://127.0.0.1:8080", None) is None
    assert refuse_cross_site("POST", here, None, "none") is None  # typed in the address bar
    for origin, site in (("http://evil.example", None), ("null", None), (None, "same-site")):
        assert refuse_cross_site("DELETE", here, origin, site), (origin, site)


def test_cursor_round_trip_and_garbage() -> None:
    at = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    assert decode_cursor(encode_cursor(at, "id|with|bars"), True) == (at, "id|with|bars")
    assert decode_cursor(None, True) == (FAR_FUTURE, "")
    assert decode_cursor("not a cursor", False) == (EPOCH, "")
    assert decode_cursor("2026-01-01T00:00:00|x", False) == (EPOCH, "")  # naive: refused


def _job(key: str, state: ChainJobState, after: list[str]) -> ChainJobStatus:
    return ChainJobStatus(
        key=key,
        type="t",
        state=state,
        after=after,
        sequence=None,
        try_=1,
        tries=1,
        total_tries=1,
        sequence_try=None,
        job_id=None,
        started_at=None,
        finished_at=None,
        status="<b>" if key == "c" else None,
        result=None,
        error=None,
    )


def test_dag_layers_edges_colours_and_escaping() -> None:
    svg = dag(
        [_job("a", "succeeded", []), _job("b", "failed", ["a"]), _job("c", "pending", ["a", "b"])]
    )
    assert svg.count("<line") == 3
    assert svg.count('class="node"') == 3
    assert 'data-key="b" data-state="failed"><rect x="250"' in svg  # layer 1
    assert 'data-key="c" data-state="pending"><rect x="480"' in svg  # layer 2: after b
    assert "&lt;b&gt;" in svg and "<b>" not in svg


def test_buckets() -> None:
    assert _bucket(0.0) == 0 and _bucket(BUCKETS[-1]) == len(BUCKETS) - 1
    assert _bucket(BUCKETS[-1] + 1) == len(BUCKETS)


def test_prometheus_text_parses_and_buckets_are_cumulative() -> None:
    fields = {
        "c:succeeded:email": "3",
        "h:run:email:0": "2",
        "h:run:email:3": "1",
        "h:run:email:14": "1",
        "hs:run:email": "301.5",
        "c:bogus": "1",  # malformed fields are skipped, not fatal
    }
    out: list[str] = []
    render_counters(fields, out)
    samples = {
        (s.name, s.labels.get("le")): s.value
        for f in text_string_to_metric_families("\n".join(out) + "\n")
        for s in f.samples
    }
    assert samples[("hivejobs_jobs_succeeded_total", None)] == 3
    assert samples[("hivejobs_job_run_seconds_bucket", "0.005")] == 2
    assert samples[("hivejobs_job_run_seconds_bucket", "0.05")] == 3
    assert samples[("hivejobs_job_run_seconds_bucket", "+Inf")] == 4
    assert samples[("hivejobs_job_run_seconds_count", None)] == 4
    assert samples[("hivejobs_job_run_seconds_sum", None)] == 301.5


class FlakyRedis(fakeredis.FakeRedis):
    fail = True

    def pipeline(self, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        if FlakyRedis.fail:
            raise redis.ConnectionError("down")
        return super().pipeline(*args, **kwargs)


@pytest.fixture
def broker() -> Broker:
    b = Broker(Settings(database_url="postgresql://x/y", redis_url="redis://127.0.0.1:1/0"))
    b.redis = FlakyRedis()
    return b


def test_recorder_keeps_increments_across_a_failed_flush(broker: Broker) -> None:
    rec = Recorder(broker)
    done = Completion(id="j", claim_token=1, outcome="succeeded")
    rec.completion("email", done)
    rec.completion("email", Completion(id="k", claim_token=2, outcome="retry"))
    job = ClaimedJob(
        id="j",
        name="email",
        attempt=1,
        attempts=1,
        delivery="at_least_once",
        payload=b"{}",
        claim_token=1,
        priority=0,
        pickup_s=0.02,
    )
    rec.picked_up([job])
    FlakyRedis.fail = True
    assert rec.flush() is False
    rec.completion("email", done)
    FlakyRedis.fail = False
    assert rec.flush() is True
    stored = {
        k.decode(): v.decode()
        for k, v in broker.redis.hgetall(broker.metrics_key).items()
        if isinstance(k, bytes) and isinstance(v, bytes)
    }
    assert stored["c:succeeded:email"] == "2"
    assert stored["c:retried:email"] == "1"
    assert stored["h:pickup:email:2"] == "1"
    assert float(stored["hs:pickup:email"]) == pytest.approx(0.02)
    assert rec.flush() is True  # nothing left: no second write
    assert broker.redis.hget(broker.metrics_key, "c:succeeded:email") == b"2"


def test_responses_that_inherit_records_keep_their_wire_shape() -> None:
    """WorkerOut and LeaderOut inherit records.WorkerInfo / LeaseInfo: the JSON and the
    schema clients see are what the API always sent (keys, order, required, types)."""
    at = datetime(2026, 1, 2, tzinfo=UTC)
    info = WorkerInfo(
        id="w", host="h", pid=7, role="pool", pool="p", started_at=at, heartbeat_at=at,
        heartbeat_age_s=0.5, running=2,
    )  # fmt: skip
    worker = msgspec.json.encode(WorkerOut(**msgspec.structs.asdict(info)))
    assert worker == (
        b'{"id":"w","host":"h","pid":7,"role":"pool","pool":"p",'
        b'"started_at":"2026-01-02T00:00:00Z","heartbeat_at":"2026-01-02T00:00:00Z",'
        b'"heartbeat_age_s":0.5,"running":2}'
    )
    leader = LeaderOut(holder=None, term=3, valid=False, expires_in_s=-1.5)
    assert msgspec.json.encode(leader) == (
        b'{"holder":null,"term":3,"valid":false,"expires_in_s":-1.5}'
    )
    schema = msgspec.json.schema(LeaderOut)["$defs"]["LeaderOut"]
    assert sorted(schema["required"]) == ["expires_in_s", "holder", "term", "valid"]
    assert list(schema["properties"]) == ["holder", "term", "valid", "expires_in_s"]
