"""Flow control without servers: what a claim may take (decide), and refused options."""

from __future__ import annotations

import pytest

from hivejobs import App, InvalidJobType, JobContext, PayloadInvalid
from hivejobs.flow import (
    PAUSE_POLL_S,
    SLOT_POLL_S,
    Limits,
    checked_limits,
    choose,
    decide,
    parse_rate,
    partition_wait_s,
    pick_partitions,
)
from hivejobs.store.flow import Bucket, FlowState

GC3 = Limits(global_concurrency=3)
R10 = Limits(rate_per_s=10.0, burst=5)
BOTH = Limits(global_concurrency=3, rate_per_s=10.0, burst=5)


def st(
    paused: bool = False, tokens: float = 0.0, since_s: float = 0.0, running: int = 0
) -> FlowState:
    return FlowState(paused=paused, tokens=tokens, since_s=since_s, running=running)


@pytest.mark.parametrize(
    ("limits", "want", "state", "allowed", "wait_s", "tokens"),
    [
        (None, 8, st(), 8, 0.0, None),  # no limits: all
        (None, 8, st(paused=True), 0, PAUSE_POLL_S, None),  # paused: none, look again later
        (GC3, 8, st(running=0), 3, 0.0, None),  # up to the free slots
        (GC3, 8, st(running=2), 1, 0.0, None),
        (GC3, 8, st(running=3), 0, SLOT_POLL_S, None),  # full: wait for a slot
        (GC3, 8, st(running=5), 0, SLOT_POLL_S, None),  # over (a limit lowered): none
        (GC3, 2, st(running=0), 2, 0.0, None),  # fewer wanted than free
        (R10, 8, st(tokens=0.0, since_s=0.25), 2, 0.0, 2.5),  # refilled at 10/s
        (R10, 8, st(tokens=0.0, since_s=60.0), 5, 0.0, 5.0),  # capped at the burst
        (R10, 8, st(tokens=0.5, since_s=0.0), 0, 0.05, 0.5),  # half a token: wait for one
        (R10, 1, st(tokens=4.0, since_s=0.0), 1, 0.0, 4.0),
        (BOTH, 8, st(tokens=5.0, running=2), 1, 0.0, 5.0),  # the tighter limit wins
        (BOTH, 8, st(tokens=0.0, running=3), 0, 0.1, 0.0),  # both: the longer wait
        (BOTH, 8, st(paused=True, tokens=5.0), 0, PAUSE_POLL_S, None),
    ],
)
def test_decide(
    limits: Limits | None,
    want: int,
    state: FlowState,
    allowed: int,
    wait_s: float,
    tokens: float | None,
) -> None:
    room = decide(limits, want, state)
    assert room.allowed == allowed
    assert room.wait_s == pytest.approx(wait_s)
    assert room.tokens == (None if tokens is None else pytest.approx(tokens))


@pytest.mark.parametrize(
    ("limits", "cap"),
    [
        (GC3, 3),
        (R10, None),  # a rate alone: the claim counts no running rows
        (BOTH, 3),
        (Limits(global_concurrency=2, limit_by="customer"), None),  # counted per partition
        (Limits(rate_per_s=10.0, burst=5, limit_by="customer"), None),
    ],
)
def test_only_a_type_wide_cap_needs_the_running_count(limits: Limits, cap: int | None) -> None:
    assert limits.type_cap == cap


def test_rate_wait_is_capped_for_slow_rates() -> None:
    room = decide(Limits(rate_per_s=1 / 3600, burst=1), 1, st(tokens=0.0))
    assert room.allowed == 0 and room.wait_s == 1.0  # re-reads the bucket every second


@pytest.mark.parametrize(
    ("text", "per_s"),
    [("100/s", 100.0), ("30/m", 0.5), ("36/h", 0.01), (" 2.5 / sec ", 2.5), ("1/minute", 1 / 60)],
)
def test_parse_rate(text: str, per_s: float) -> None:
    assert parse_rate(text) == pytest.approx(per_s)


@pytest.mark.parametrize("text", ["100", "0/s", "-1/s", "1/d", "fast", "1/s/s"])
def test_bad_rate_is_refused(text: str) -> None:
    with pytest.raises(InvalidJobType, match="rate must look like '100/s'"):
        parse_rate(text)


def test_default_burst_is_one_second_of_starts() -> None:
    assert checked_limits(None, "100/s", None) == Limits(None, 100.0, 100)
    assert checked_limits(None, "30/m", None) == Limits(None, 0.5, 1)
    assert checked_limits(4, None, None) == Limits(4, None, 1)
    assert checked_limits(None, None, None) is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"global_concurrency": 0},
            "global_concurrency must be a whole number of jobs, at least 1",
        ),
        ({"global_concurrency": 2.5}, "global_concurrency must be a whole number"),
        ({"global_concurrency": True}, "global_concurrency must be a whole number"),
        ({"burst": 3}, "burst needs a rate"),
        ({"rate": "5/s", "burst": 0}, "burst must be a whole number of jobs, at least 1"),
        ({"rate": 5}, "rate must look like"),
        ({"limit_by": "customer_id"}, "limit_by needs global_concurrency or rate"),
        ({"global_concurrency": 2, "limit_by": ""}, "limit_by must be the name of a payload"),
        ({"global_concurrency": 2, "limit_by": 3}, "limit_by must be the name of a payload"),
        ({"max_rss_mb": 0}, "max_rss_mb must be a positive number of MiB"),
        ({"max_rss_mb": "1G"}, "max_rss_mb must be a positive number of MiB"),
    ],
)
def test_bad_limits_are_refused_at_registration(options: dict[str, object], message: str) -> None:
    app = App()
    with pytest.raises(InvalidJobType, match=message):
        app.job("t", **options)  # type: ignore[arg-type]
    assert "t" not in app.types


def test_limits_reach_the_job_type() -> None:
    app = App()

    @app.job("t", global_concurrency=2, rate="10/s", burst=3)
    def handler(ctx: JobContext, payload: object) -> None:
        return None

    assert app.types["t"].limits == Limits(2, 10.0, 3)


BY = Limits(global_concurrency=2, limit_by="customer_id")


@pytest.mark.parametrize(
    ("candidates", "running", "want", "chosen"),
    [
        ([("1", "a"), ("2", "a"), ("3", "a")], {}, 8, ["1", "2"]),  # 2 per partition
        ([("1", "a"), ("2", "b"), ("3", "a")], {"a": 1}, 8, ["1", "2"]),  # a has 1 free
        ([("1", "a"), ("2", "b"), ("3", "b")], {"a": 2}, 8, ["2", "3"]),  # full a: b goes on
        ([("1", "a"), ("2", "b"), ("3", "c")], {}, 2, ["1", "2"]),  # at most `want`
        ([("1", "a"), ("2", "a")], {"a": 5}, 8, []),  # over (a limit lowered): none
        ([], {}, 8, []),
    ],
)
def test_choose(
    candidates: list[tuple[str, str]], running: dict[str, int], want: int, chosen: list[str]
) -> None:
    assert choose(candidates, running, 2, want) == chosen


def test_limit_by_leaves_the_type_wide_count_to_the_claim() -> None:
    # 9 running of the type say nothing about one customer: the pool pops, the claim picks.
    assert decide(BY, 4, st(running=9)).allowed == 4
    assert decide(BY, 4, st(paused=True)).allowed == 0


def test_limit_by_reaches_the_job_type() -> None:
    app = App()
    app.job("t", global_concurrency=2, limit_by="customer_id")(lambda ctx, payload: None)
    assert app.types["t"].limits == BY


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ([1, 2], "limit_by='customer_id' needs a JSON object payload"),
        (None, "needs a JSON object payload"),
        ({"other": 1}, "the payload has no 'customer_id' field"),
    ],
)
def test_limit_by_payload_without_the_field_is_refused(payload: object, message: str) -> None:
    app = App()
    app.job("t", global_concurrency=2, limit_by="customer_id")(lambda ctx, payload: None)
    with pytest.raises(PayloadInvalid, match=message):
        app.types["t"].new_job(payload, None, None, None, None, None)
    app.types["t"].new_job({"customer_id": None}, None, None, None, None, None)  # null: a value


BY_RATE = Limits(global_concurrency=2, rate_per_s=10.0, burst=3, limit_by="customer_id")


@pytest.mark.parametrize(
    ("candidates", "running", "buckets", "want", "chosen", "tokens"),
    [
        # No row: a full bucket (3), and at most 2 running per customer.
        ([("1", "a"), ("2", "a"), ("3", "a")], {}, {}, 8, ["1", "2"], {"a": 3.0}),
        # a has half a token left: none of a; b's bucket is full and runs on.
        (
            [("1", "a"), ("2", "b"), ("3", "b")],
            {},
            {"a": Bucket(0.5, 0.0)},
            8,
            ["2", "3"],
            {"a": 0.5, "b": 3.0},
        ),
        # a refilled 0.1 s at 10/s since it held 0.2: one token (1.2), so one job.
        (
            [("1", "a"), ("2", "a")],
            {},
            {"a": Bucket(0.2, 0.1)},
            8,
            ["1"],
            {"a": 1.2},
        ),
        # Refill stops at the burst, however long the bucket waited.
        ([("1", "a")], {}, {"a": Bucket(0.0, 60.0)}, 8, ["1"], {"a": 3.0}),
        # Tokens but no slot: a's two slots are taken.
        ([("1", "a"), ("2", "b")], {"a": 2}, {}, 8, ["2"], {"a": 3.0, "b": 3.0}),
        # At most `want`, tokens or not.
        ([("1", "a"), ("2", "b")], {}, {}, 1, ["1"], {"a": 3.0, "b": 3.0}),
    ],
)
def test_pick_partitions(
    candidates: list[tuple[str, str]],
    running: dict[str, int],
    buckets: dict[str, Bucket],
    want: int,
    chosen: list[str],
    tokens: dict[str, float],
) -> None:
    picked = pick_partitions(BY_RATE, candidates, running, buckets, want)
    assert picked.ids == chosen
    assert picked.parts == {i: p for i, p in candidates if i in chosen}
    assert picked.tokens == pytest.approx(tokens)


def test_a_partitioned_rate_alone_caps_starts_not_running_jobs() -> None:
    rate_only = Limits(rate_per_s=10.0, burst=2, limit_by="customer_id")
    picked = pick_partitions(rate_only, [("1", "a"), ("2", "a"), ("3", "a")], {}, {}, 8)
    assert picked.ids == ["1", "2"]  # the burst, whatever runs


def test_a_pool_out_of_tokens_waits_for_the_soonest_token_never_zero() -> None:
    fast = Limits(rate_per_s=100.0, burst=1, limit_by="c")
    empty = pick_partitions(fast, [("1", "a"), ("2", "b")], {}, {"a": Bucket(0.5, 0.0)}, 8)
    # b was full and took its token; a needs 0.5 token at 100/s: 5 ms.
    assert partition_wait_s(fast, empty) == pytest.approx(0.005)
    none_left = pick_partitions(fast, [("1", "a")], {}, {"a": Bucket(0.0, 0.0)}, 8)
    assert none_left.ids == []
    assert 0 < partition_wait_s(fast, none_left) <= SLOT_POLL_S
    slow = Limits(rate_per_s=0.5, burst=1, limit_by="c")
    assert partition_wait_s(slow, pick_partitions(slow, [("1", "a")], {}, {}, 8)) == SLOT_POLL_S


def test_a_partitioned_rate_leaves_the_type_wide_bucket_alone() -> None:
    # The type-wide bucket is empty, yet the pool pops: the partitions' buckets decide.
    room = decide(BY_RATE, 4, st(tokens=0.0))
    assert (room.allowed, room.tokens) == (4, None)


def test_limit_by_with_a_rate_reaches_the_job_type() -> None:
    app = App()
    app.job("t", rate="20/s", limit_by="customer_id")(lambda ctx, payload: None)
    assert app.types["t"].limits == Limits(None, 20.0, 20, "customer_id")
