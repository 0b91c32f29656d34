"""Every hot statement finds its rows in a bounded number of buffers, whatever the statistics.

The planner's statistics for the hot table are whatever the last ANALYZE saw: nothing (a new
table, autovacuum off), an empty table (a fresh deploy, a quiet spell), or a full queue (an
ANALYZE in the middle of a bulk enqueue, nothing running). For each of the three, 50,000
queued jobs are loaded, 5 % of them claimed, and every hot statement is run under
`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)` (writes in a transaction that is rolled back), both
as planned for its parameter values (a custom plan) and as psycopg runs it once prepared
(a generic plan). The buffers read by the scans of `hivejobs_job` (the work of finding the
rows, not of writing them) must stay within BUFFERS_PER_ROW per row the statement is about:
a scan of the queue or of the running set costs hundreds, a primary-key lookup a few.
No timing is involved: buffers are counted, not milliseconds.

A session keeps the plan of each statement it prepared: plans made while the hot table held
nothing or a page of jobs (a process started on a quiet queue) are run on the full one too,
under the planner settings of the pools' and the coordinator's sessions (PREPARED_PLANS).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from hivejobs.coordinator import Coordinator
from hivejobs.records.jobs import Completion
from hivejobs.store import PREPARED_PLANS, QUERIES, Store, new_worker_id
from hivejobs.store.jobs import archive_rows
from hivejobs.store.session_settings import connect_kwargs
from hivejobs.store.sql import load_queries

CALLBACK_QUERIES = load_queries("callback_queries.sql")
CHAIN_QUERIES = load_queries("chain_queries.sql")
FLOW_QUERIES = load_queries("flow.sql")
QUEUED = 50_000
CLAIMED = QUEUED // 20  # 5 % of the queue is running
BATCH = 8  # ids per claim or completion batch: small, so that any scan of a set shows
BUFFERS_PER_ROW = 10
SCHEDULED = 1_000  # waiting for a future run time, besides the due ones
SCAN_NODES = {
    "Seq Scan",
    "Index Scan",
    "Index Only Scan",
    "Bitmap Heap Scan",
    "Tid Scan",
    "Tid Range Scan",
    "Sample Scan",
}
STATS = ("absent", "empty_table", "full_queue")
# hivejobs_flow_bucket: limit_by's token buckets, one row per busy partition (PARTITIONS of
# them, far more than a claim touches).
HOT_TABLES = {"hivejobs_job", "hivejobs_flow_bucket"}
PARTITIONS = 20_000


@dataclass(frozen=True)
class Loaded:
    """The ids each statement is given: rows it should find, BATCH of each kind."""

    next_queued: list[str]  # queued, not yet claimed: the next claim
    running: list[tuple[str, int]]  # (id, claim token) held by the live worker `busy`
    small: str  # a live worker holding BATCH claims (its own running set)
    small_ids: list[str]
    dead: str  # a worker whose heartbeat stopped, holding BATCH claims


@dataclass(frozen=True)
class Measured:
    statement: str
    plan_kind: str
    rows: int
    buffers: int
    scans: list[str]

    @property
    def per_row(self) -> float:
        return self.buffers / max(self.rows, 1)


def hivejobs_session(url: str) -> psycopg.Connection[Any]:
    """A direct connection with the planner settings of the pools' and the coordinator's
    sessions (PREPARED_PLANS)."""
    return psycopg.connect(url, **connect_kwargs(False, PREPARED_PLANS))


def load(conn: psycopg.Connection[Any], stats: str) -> Loaded:
    """The hot table as a drain sees it, with the planner statistics `stats` describes
    (after without_autovacuum: no DDL here, which would make prepared statements replan)."""
    if stats == "empty_table":
        conn.execute("ANALYZE hivejobs_job")
        conn.execute("ANALYZE hivejobs_flow_bucket")
    conn.execute(
        """INSERT INTO hivejobs_job (id, name, state, attempts, delivery, payload, run_at,
                                     queued_at)
           SELECT gen_random_uuid()::text, 'noop', 'queued', 3, 'at_least_once', '\\x7b7d',
                  now(), now()
             FROM generate_series(1, %s)""",
        (QUEUED,),
    )
    # Waiting jobs: most scheduled for later, BATCH due now, BATCH past their expiry and
    # BATCH cancelled while a retry waited (the Promoter's work).
    conn.execute(
        """INSERT INTO hivejobs_job (id, name, state, attempts, delivery, payload, run_at,
                                     queued_at, expires_at, cancel_requested)
           SELECT gen_random_uuid()::text, 'noop', s.state, 3, 'at_least_once', '\\x7b7d',
                  s.run_at, CASE WHEN s.state = 'queued' THEN now() END, s.expires_at,
                  s.cancel
             FROM generate_series(1, %(n)s) i,
                  LATERAL (SELECT CASE WHEN i <= %(b)s THEN 'queued' ELSE 'scheduled' END
                                      AS state,
                                  CASE WHEN i <= 3 * %(b)s THEN now() - interval '1 minute'
                                       ELSE now() + interval '1 hour' END AS run_at,
                                  CASE WHEN i <= %(b)s THEN now() - interval '1 second'
                                  END AS expires_at,
                                  i > %(b)s AND i <= 2 * %(b)s AS cancel) s""",
        {"n": SCHEDULED + 3 * BATCH, "b": BATCH},
    )
    # A small queue whose jobs came after the big one's: the reconciler must find them
    # without stepping over the other queue's backlog.
    conn.execute(
        """INSERT INTO hivejobs_job (id, name, state, attempts, delivery, payload, run_at,
                                     queued_at)
           SELECT gen_random_uuid()::text, 'late', 'queued', 3, 'at_least_once', '\\x7b7d',
                  now(), now()
             FROM generate_series(1, %s)""",
        (BATCH,),
    )
    # Buckets of many partitions, all still refilling but BATCH that are full again.
    conn.execute(
        """INSERT INTO hivejobs_flow_bucket (name, part, tokens, refilled_at, full_at)
           SELECT 'noop', i::text, 0.5, now(),
                  now() + CASE WHEN i <= %(b)s THEN -1 ELSE 60 END * interval '1 second'
             FROM generate_series(1, %(n)s) i""",
        {"n": PARTITIONS, "b": BATCH},
    )
    if stats == "full_queue":
        conn.execute("ANALYZE hivejobs_job")
        conn.execute("ANALYZE hivejobs_flow_bucket")
    # The type's flow row (a limited type's pools read it before each pop: flow_room).
    conn.execute("INSERT INTO hivejobs_flow (name) VALUES ('noop')")
    busy, small, dead = (str(uuid.uuid4()) for _ in range(3))
    conn.execute(
        """INSERT INTO hivejobs_worker (id, host, pid, role, pool, heartbeat_at)
           VALUES (%s, 'h', 1, 'pool', 'noop', now()), (%s, 'h', 2, 'pool', 'noop', now()),
                  (%s, 'h', 3, 'pool', 'noop', now() - interval '1 hour')""",
        (busy, small, dead),
    )
    # Claims take the oldest jobs, as the Redis lists hand them out: the head of the heap.
    conn.execute(
        """WITH head AS (
               SELECT id, row_number() OVER (ORDER BY ctid) AS n FROM hivejobs_job
                WHERE state = 'queued' AND expires_at IS NULL ORDER BY ctid LIMIT %(claimed)s
           )
           UPDATE hivejobs_job j
              SET state = 'running', attempt = 1, started_at = now(),
                  claim_token = nextval('hivejobs_claim_seq'),
                  worker_id = CASE WHEN head.n <= %(b)s THEN %(dead)s::uuid
                                   WHEN head.n <= 2 * %(b)s THEN %(small)s::uuid
                                   ELSE %(busy)s::uuid END
             FROM head WHERE j.id = head.id""",
        {"claimed": CLAIMED, "b": BATCH, "dead": dead, "small": small, "busy": busy},
    )
    next_queued = [
        r[0]
        for r in conn.execute(
            """SELECT id FROM hivejobs_job WHERE state = 'queued' AND expires_at IS NULL
                ORDER BY ctid LIMIT %s""",
            (BATCH,),
        )
    ]
    running = conn.execute(
        "SELECT id, claim_token FROM hivejobs_job WHERE worker_id = %s ORDER BY ctid LIMIT %s",
        (busy, BATCH),
    ).fetchall()
    small_ids = [
        r[0] for r in conn.execute("SELECT id FROM hivejobs_job WHERE worker_id = %s", (small,))
    ]
    return Loaded(next_queued, [(r[0], int(r[1])) for r in running], small, small_ids, dead)


def without_autovacuum(conn: psycopg.Connection[Any]) -> None:
    """Whatever the server does, the hot tables' statistics are the ones the test sets."""
    for table in HOT_TABLES:
        conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")


def hot_statements(ld: Loaded) -> list[tuple[str, str, dict[str, Any], int]]:
    """(name, SQL, parameters, rows it is about) for every statement on the hot path."""
    ids = [i for i, _ in ld.running]
    tokens = [t for _, t in ld.running]
    n = len(ids)
    parts = [str(PARTITIONS - i) for i in range(n)]  # busy partitions, far from the first
    return [
        (
            "claim_queued",
            QUERIES["claim_queued"],
            {"ids": ld.next_queued, "worker_id": ld.small, "name": "noop"},
            n,
        ),
        (
            "archive_finished_if_running",
            QUERIES["archive_finished_if_running"],
            {
                "ids": ids,
                "rows": archive_rows(
                    [Completion(id=i, claim_token=t, outcome="succeeded") for i, t in ld.running]
                ),
            },
            n,
        ),
        (
            "requeue_if_running",
            QUERIES["requeue_if_running"],
            {
                "ids": ids,
                "tokens": tokens,
                "delays": [0.0] * (n // 2) + [5.0] * (n - n // 2),
                "uncounts": [0] * n,
                "errors": ["boom"] * n,
            },
            n,
        ),
        (
            "release_claims_if_running",
            QUERIES["release_claims_if_running"],
            {"ids": ids, "tokens": tokens, "worker_id": ld.small},
            n,
        ),
        (
            "suspend_chain_tries",
            CHAIN_QUERIES["suspend_chain_tries"],
            {"ids": ids, "tokens": tokens},
            n,
        ),
        (
            "release_unstarted_if_mine",
            QUERIES["release_unstarted_if_mine"],
            {"ids": ld.small_ids, "worker_id": ld.small},
            n,
        ),
        ("running_claims", QUERIES["running_claims"], {"worker_id": ld.small}, n),
        ("find_dead_workers", QUERIES["find_dead_workers"], {"stuck_after_s": 30.0}, 3),
        (
            "rescue_requeue",
            QUERIES["rescue_requeue"],
            {"worker_ids": [ld.dead], "poison_after": 3},
            n,
        ),
        ("rescue_fail", QUERIES["rescue_fail"], {"worker_ids": [ld.dead], "poison_after": 3}, n),
        ("promote_due", QUERIES["promote_due"], {"limit": 10_000}, 2 * n),
        ("end_waiting_jobs", QUERIES["end_waiting_jobs"], {"limit": 10_000}, 2 * n),
        # The probes that spare an idle coordinator its guarded transactions: one row each.
        ("any_due", QUERIES["any_due"], {}, 1),
        ("any_waiting_ended", QUERIES["any_waiting_ended"], {}, 1),
        ("any_callback_timed_out", CALLBACK_QUERIES["any_callback_timed_out"], {}, 1),
        (
            "stale_queued",
            QUERIES["stale_queued"],
            {"name": "noop", "priority": 0, "grace_s": 0.0, "before": None, "limit": n},
            n,
        ),
        # The reconciler's look for ids Redis lost: an entry per queue, the heads by key.
        ("oldest_queued", QUERIES["oldest_queued"], {"grace_s": 2.0}, 3),
        ("queued_at_of", QUERIES["queued_at_of"], {"ids": ld.next_queued}, n),
        # A fair type's queue judged key by key: a page of its oldest rows with their keys,
        # and the lost ones re-stamped by primary key.
        (
            "oldest_queued_keyed",
            QUERIES["oldest_queued_keyed"],
            {
                "name": "noop",
                "priority": 0,
                "field": "customer",
                "grace_s": 2.0,
                "after_at": datetime(1970, 1, 1, tzinfo=UTC),
                "after_id": "",
                "limit": n,
            },
            n,
        ),
        ("restamp_queued", QUERIES["restamp_queued"], {"ids": ld.next_queued}, n),
        (
            "queued_page",
            QUERIES["queued_page"],
            {
                "name": "noop",
                "priority": 0,
                "after_at": datetime(1970, 1, 1, tzinfo=UTC),
                "after_id": "",
                "limit": n,
            },
            n,
        ),
        (
            "stale_queued, small queue",
            QUERIES["stale_queued"],
            {"name": "late", "priority": 0, "grace_s": 0.0, "before": None, "limit": 1000},
            n,
        ),
        # Gauges count rows: what they are about is every row they count.
        ("queued_counts", QUERIES["queued_counts"], {}, QUEUED - CLAIMED + 2 * BATCH),
        ("running_counts", QUERIES["running_counts"], {}, CLAIMED),
        # A limited type's look before a pop: its flow row by primary key, and its running
        # rows counted only for a cap on them (a rate alone, or limit_by, reads none).
        (
            "flow_room, capped",
            FLOW_QUERIES["flow_room"],
            {"name": "noop", "counts_running": True},
            CLAIMED,
        ),
        (
            "flow_room, rate alone",
            FLOW_QUERIES["flow_room"],
            {"name": "noop", "counts_running": False},
            0,
        ),
        # limit_by (flow.py): the popped ids' partitions by primary key, and the type's
        # running rows counted per partition (every running row of the type is read).
        (
            "flow_partitions",
            FLOW_QUERIES["flow_partitions"],
            {"ids": ld.next_queued, "name": "noop", "field": "customer"},
            n,
        ),
        (
            "flow_running_by_partition",
            FLOW_QUERIES["flow_running_by_partition"],
            {"name": "noop", "field": "customer", "parts": [""]},
            CLAIMED,
        ),
        # limit_by with a rate: the popped partitions' buckets read by key, written by an
        # upsert (its conflict check probes the primary key, no scan node: 0 buffers here),
        # and the coordinator's prune of the full ones (through the full_at index).
        (
            "flow_buckets",
            FLOW_QUERIES["flow_buckets"],
            {"name": "noop", "parts": parts, "now": datetime.now(UTC)},
            n,
        ),
        (
            "flow_take_partition_tokens",
            FLOW_QUERIES["flow_take_partition_tokens"],
            {
                "name": "noop",
                "parts": parts,
                "tokens": [0.0] * n,
                "refill_s": [1.0] * n,
                "now": datetime.now(UTC),
            },
            n,
        ),
        ("prune_full_buckets", FLOW_QUERIES["prune_full_buckets"], {}, BATCH),
    ]


def generic(query: str, params: dict[str, Any]) -> tuple[str, list[Any]]:
    """The statement with $n placeholders, and its values in that order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", number, query), [params[name] for name in names]


def explain(conn: psycopg.Connection[Any], query: str, params: dict[str, Any], kind: str) -> Any:
    """EXPLAIN ANALYZE in a transaction rolled back: the table is the same for the next one."""
    try:
        with conn.transaction(force_rollback=True):
            if kind == "custom":
                return conn.execute(
                    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params
                ).fetchone()[0][0]  # type: ignore[index]
            text, values = generic(query, params)
            conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            types = prepare(conn, "hot", text)
            return execute(conn, "hot", types, values, explained=True)
    finally:
        conn.execute("DEALLOCATE ALL")


def prepare(conn: psycopg.Connection[Any], name: str, text: str) -> list[str]:
    """PREPARE `text` as `name`: its parameter types, as Postgres inferred them."""
    conn.execute(f"PREPARE {name} AS {text}")
    row = conn.execute(
        "SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = %s", (name,)
    ).fetchone()
    assert row is not None
    return list(row[0])


def execute(
    conn: psycopg.Connection[Any],
    name: str,
    types: list[str],
    values: list[Any],
    explained: bool = False,
) -> Any:
    """EXECUTE prepared statement `name` (a client-side cursor: a cast placeholder per
    parameter); `explained`: under EXPLAIN ANALYZE, its plan as JSON."""
    args = f"({', '.join(f'%s::{t}' for t in types)})" if types else ""
    prefix = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " if explained else ""
    cur = psycopg.ClientCursor(conn).execute(f"{prefix}EXECUTE {name}{args}", values)
    return cur.fetchone()[0][0] if explained else None  # type: ignore[index]


def scans_of_hot_table(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The top-most scan nodes of the hot tables: their buffers include their index scans."""
    if node["Node Type"] in SCAN_NODES and node.get("Relation Name") in HOT_TABLES:
        yield node
        return
    for child in node.get("Plans", []):
        yield from scans_of_hot_table(child)


def init_plans(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if node.get("Parent Relationship") == "InitPlan" and "returns" in node.get("Subplan Name", ""):
        yield node
    for child in node.get("Plans", []):
        yield from init_plans(child)


def finding_buffers(plan: dict[str, Any]) -> tuple[int, list[str]]:
    """Buffers read by the scans of hivejobs_job, each counted once.

    A scan that uses an InitPlan's value (`id = ANY($0)`) runs that InitPlan inside itself,
    so its buffers include the InitPlan's, which are also counted at the InitPlan's own scans.
    """
    scans = list(scans_of_hot_table(plan))
    total = sum(s["Shared Hit Blocks"] + s["Shared Read Blocks"] for s in scans)
    conditions = json.dumps(scans)
    for init in init_plans(plan):
        params = re.findall(r"\$\d+", init["Subplan Name"].split("returns", 1)[1])
        if any(re.search(re.escape(p) + r"\b", conditions) for p in params):
            total -= init["Shared Hit Blocks"] + init["Shared Read Blocks"]
    return total, [describe(s) for s in scans]


def describe(node: dict[str, Any]) -> str:
    index = node.get("Index Name")
    if index is None and node.get("Plans"):
        index = "+".join(str(c.get("Index Name", c["Node Type"])) for c in node["Plans"])
    return f"{node['Node Type']}" + (f" using {index}" if index else "")


def measure(conn: psycopg.Connection[Any], ld: Loaded) -> list[Measured]:
    results = []
    for name, query, params, rows in hot_statements(ld):
        for kind in ("custom", "generic"):
            plan = explain(conn, query, params, kind)
            buffers, scans = finding_buffers(plan["Plan"])
            results.append(Measured(name, kind, rows, buffers, scans))
    return results


@pytest.mark.parametrize("stats", STATS)
def test_hot_statements_find_rows_in_bounded_buffers(database_url: str, stats: str) -> None:
    with hivejobs_session(database_url) as conn:
        without_autovacuum(conn)
        ld = load(conn, stats)
        results = measure(conn, ld)
    assert_bounded(results, f"statistics: {stats}")


def assert_bounded(results: list[Measured], situation: str) -> None:
    """Print every statement's buffers; fail naming those beyond BUFFERS_PER_ROW a row."""
    report = "\n".join(
        f"{m.statement:28} {m.plan_kind:7} {m.buffers:6} buffers {m.rows:5} rows "
        f"{m.per_row:7.1f}/row  {'; '.join(m.scans)}"
        for m in results
    )
    print(f"\n{situation}\n{report}")
    over = [m for m in results if m.buffers > BUFFERS_PER_ROW * max(m.rows, 1)]
    assert not over, f"{situation}: scans beyond {BUFFERS_PER_ROW} buffers a row:\n" + (
        "\n".join(f"{m.statement} ({m.plan_kind}): {m.buffers} for {m.rows}" for m in over)
    )


def prepared_on_quiet_table(
    conn: psycopg.Connection[Any], quiet_rows: int
) -> list[tuple[str, list[str]]]:
    """Every hot statement prepared and run once, its generic plan built while the hot table
    holds `quiet_rows` jobs in each state (none, or a page), as a pool or a coordinator that
    starts on a quiet queue builds it: (name, parameter types) of each, in hot_statements'
    order. Made-up ids: nothing is found."""
    fake = Loaded(
        next_queued=[str(uuid.uuid4()) for _ in range(BATCH)],
        running=[(str(uuid.uuid4()), i) for i in range(BATCH)],
        small=str(uuid.uuid4()),
        small_ids=[str(uuid.uuid4()) for _ in range(BATCH)],
        dead=str(uuid.uuid4()),
    )
    if quiet_rows:  # a quiet queue: a few jobs in each state, one page
        conn.execute(
            """INSERT INTO hivejobs_job (id, name, state, attempts, delivery, payload, run_at,
                                         queued_at, worker_id, claim_token, started_at)
               SELECT gen_random_uuid()::text, 'noop', s, 3, 'at_least_once', '\\x7b7d',
                      now() + CASE WHEN s = 'scheduled' THEN interval '1 hour' ELSE '0' END,
                      CASE WHEN s = 'queued' THEN now() END,
                      CASE WHEN s = 'running' THEN gen_random_uuid() END,
                      CASE WHEN s = 'running' THEN i END,
                      CASE WHEN s = 'running' THEN now() END
                 FROM generate_series(1, %s) i,
                      unnest(ARRAY['queued', 'running', 'scheduled']) s""",
            (quiet_rows,),
        )
    conn.execute("SET plan_cache_mode = force_generic_plan")
    prepared = []
    for i, (_, query, params, _) in enumerate(hot_statements(fake)):
        text, values = generic(query, params)
        types = prepare(conn, f"hot_{i}", text)
        with conn.transaction(force_rollback=True):
            execute(conn, f"hot_{i}", types, values)
        prepared.append((f"hot_{i}", types))
    return prepared


@pytest.mark.parametrize("quiet_rows", [0, 3])
def test_plans_built_on_a_quiet_table_hold_once_it_fills(
    database_url: str, quiet_rows: int
) -> None:
    """A prepared statement keeps its generic plan for its session's life: nothing but an
    ANALYZE (or DDL) of the table makes Postgres plan it again, and with autovacuum off none
    comes. A pool that starts on a quiet queue builds its plans then: each must still find
    its rows by key once 50,000 jobs are queued. Without PREPARED_PLANS a plan made on a
    page of jobs is a sequential scan: 1,216 buffers a claim or completion of 8 here."""
    with hivejobs_session(database_url) as conn:
        without_autovacuum(conn)
        prepared = prepared_on_quiet_table(conn, quiet_rows)
        ld = load(conn, "absent")
        results = []
        for (name, query, params, rows), (statement, types) in zip(
            hot_statements(ld), prepared, strict=True
        ):
            _, values = generic(query, params)
            with conn.transaction(force_rollback=True):
                plan = execute(conn, statement, types, values, explained=True)
            buffers, scans = finding_buffers(plan["Plan"])
            results.append(Measured(name, "generic", rows, buffers, scans))
    assert_bounded(results, f"planned on {quiet_rows} jobs of each state, run on a full queue")


def test_plans_that_read_a_table_in_full_are_never_compiled(database_url: str) -> None:
    """With sequential scans off, a table no index serves is still read in full, and the plan
    costs 10^10 more: past jit_above_cost, Postgres would JIT-compile it at every run (the
    pruner's delete: 350 ms instead of 1, the coordinator's CPU per job x25 in a drain)."""
    archive = load_queries("archive.sql")
    statements = [
        (archive["nonzero_gauge_types"], {}),
        (archive["prune_archive_by_type"], {"retention_s": 60.0, "limit": 1000}),
    ]
    with hivejobs_session(database_url) as conn:
        for query, params in statements:
            for kind in ("custom", "generic"):
                plan = explain(conn, query, params, kind)
                assert plan["Plan"]["Total Cost"] > 1e9  # a sequential scan, disabled
                assert "JIT" not in plan, (query, kind, plan["JIT"])


PROBES = ("any_due", "any_waiting_ended", "any_callback_timed_out")


def test_probes_prepared_on_an_empty_table_read_their_index_once_it_fills(
    make_app: Any, database_url: str
) -> None:
    """The coordinator's probes (Leases.nothing_to_write) run several times a second, so
    psycopg prepares them, and the plan each keeps is the one made then. Run on the
    coordinator's own store, first on an empty table, then with 50,000 jobs queued: each
    prepared probe still reads its index (without PREPARED_PLANS the plan made on the empty
    table is a sequential scan and a sort: 2-4 ms a call once 20,000 jobs were queued)."""
    queries = {name: QUERIES.get(name) or CALLBACK_QUERIES[name] for name in PROBES}
    app = make_app()  # the schema
    with hivejobs_session(database_url) as conn:
        without_autovacuum(conn)
    coordinator = Coordinator(app.settings, new_worker_id())
    coordinator.store.close()
    coordinator.broker.close()
    # The coordinator's session settings, on one session that runs every probe.
    store = Store(database_url, max_size=1, session=coordinator.store.session)
    try:
        for _ in range(10):  # psycopg prepares a statement at its fifth run
            for query in queries.values():
                assert store.nothing_to_write(query)
        with hivejobs_session(database_url) as conn:
            load(conn, "absent")
        with store.connection() as conn:
            names = dict(
                conn.execute("SELECT statement, name FROM pg_prepared_statements").fetchall()
            )
            kept = {name: names[query] for name, query in queries.items()}
            read = {
                name: finding_buffers(
                    conn.execute(
                        f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {prepared}"
                    ).fetchone()[0][0]["Plan"]  # type: ignore[index]
                )[0]
                for name, prepared in kept.items()
            }
    finally:
        store.close()
    assert max(read.values()) <= BUFFERS_PER_ROW, read
