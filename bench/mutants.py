"""Mutation check of the invariants' guards: each guard removed alone must fail its tests.

    python bench/mutants.py                 # every guard, then a summary; exit 1 on a survivor
    python bench/mutants.py --list          # the guards, their files and their tests
    python bench/mutants.py --only NAME[,NAME...]

A guard is a piece of text in one file of src/ (an SQL predicate, a claim-token fence, the
executor's outcome mapping, a route's auth option, a chain ordering condition) and the text
that replaces it in its mutant. The script copies src/, tests/, bench/ and pyproject.toml to
a temporary directory once (the working tree is never written), runs every named test there
unmutated (a guard whose tests already fail proves nothing), then for each guard: writes its
file with the one replacement, runs its tests with `-x` (PYTHONPATH pointing at the copy, so
the real processes the tests start run the mutant too), and puts the file back. A mutant
whose tests all pass survived: the guard is not pinned. Exit status 1 if any survived, any
baseline failed, or a guard's text is not found exactly once.

tests/unit/test_mutant_guards.py checks on every run of the suite that each guard's text
still occurs exactly once in its file and that its tests still exist, so this list cannot
rot silently when code moves. The full run takes minutes (see README, "Mutation check"): a
weekly and pre-release job, not CI.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("src", "tests", "bench")
IGNORED = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.json", "*.png", ".*cache")
RUN_TIMEOUT_S = 600.0

FENCES = "tests/integration/test_fences.py"
ROUTES = "tests/web/test_route_guard.py"
EXECUTOR = "tests/unit/test_executor.py"
ORDERING = "tests/unit/test_chain_ordering.py"
READ_REFUSED = ROUTES + "::test_a_read_token_is_refused_by_every_admin_route_and_writes_nothing"
TOKEN_NEEDED = ROUTES + "::test_every_guarded_route_needs_a_token"
CALLBACK_ROLE = "tests/web/test_callback_role.py"
DEBOUNCE = "tests/integration/test_debounce.py"
FAIR = "tests/integration/test_fair.py"
HARDENING = "tests/web/test_hardening.py"
SEQ = "tests/integration/test_sequence.py"
SEQ_PRUNE = "tests/integration/test_sequence_prune.py"
SEQ_CHAIN = "tests/integration/test_sequence_chain.py"
SEQ_PLACES = "tests/unit/test_chain_places.py"
SEQ_RETRY = SEQ_CHAIN + "::test_a_retry_keeps_the_first_tries_place_in_its_key"
SEQ_PLACE_MIGRATION = "src/hivejobs/store/migrations/0024_sequence_chain_steps.sql"
# The idle-counter prune: its two statements (lock_idle, delete_idle) each check the key;
# a guard removes the check from both, the text between them included.
SEQ_PRUNE_SQL = (
    "SELECT s.name, s.key FROM hivejobs_sequence s\n"
    " WHERE s.used_at < now() - %(retention_s)s * interval '1 second'\n"
    "   AND NOT EXISTS (SELECT 1 FROM hivejobs_job j WHERE j.name = s.name AND j.seq_key = s.key)\n"
    "   AND NOT EXISTS (SELECT 1 FROM hivejobs_sequence_hold h\n"
    "                    WHERE h.name = s.name AND h.key = s.key)\n"
    "   AND NOT EXISTS (SELECT 1 FROM hivejobs_sequence_place p\n"
    "                    WHERE p.name = s.name AND p.key = s.key)\n"
    " LIMIT %(limit)s\n"
    "   FOR UPDATE OF s SKIP LOCKED;\n"
    "\n"
    "-- name: delete_idle\n"
    "-- The second statement, in lock_idle's transaction, under its row locks: a new snapshot, so\n"
    "-- it sees every job an enqueuer numbered before we took the row (lock_idle's own snapshot\n"
    "-- may be older than that enqueuer's commit), and deletes the row only if the key still has\n"
    "-- no live job and no hold. A key's number restarts only when nothing of the key is live: no\n"
    "-- job can then be numbered before one still waiting.\n"
    "DELETE FROM hivejobs_sequence s\n"
    " USING unnest(%(names)s::text[], %(keys)s::text[]) AS k(name, key)\n"
    " WHERE s.name = k.name AND s.key = k.key\n"
    "   AND s.used_at < now() - %(retention_s)s * interval '1 second'\n"
    "   AND NOT EXISTS (SELECT 1 FROM hivejobs_job j WHERE j.name = s.name AND j.seq_key = s.key)\n"
    "   AND NOT EXISTS (SELECT 1 FROM hivejobs_sequence_hold h\n"
    "                    WHERE h.name = s.name AND h.key = s.key)\n"
    "   AND NOT EXISTS (SELECT 1 FROM hivejobs_sequence_place p\n"
    "                    WHERE p.name = s.name AND p.key = s.key)\n"
    "RETURNING s.key;"
)


@dataclass(frozen=True)
class Guard:
    """One guard: `find` occurs exactly once in `path`; its mutant has `replace` instead.
    `tests` are pytest node ids (run with -x) of which at least one must fail."""

    name: str
    path: str
    find: str
    replace: str
    tests: tuple[str, ...]
    why: str


GUARDS: tuple[Guard, ...] = (
    # -- the claim ---------------------------------------------------------------------------
    Guard(
        "claim-state",
        "src/hivejobs/store/jobs.sql",
        "WHERE id = ANY(%(ids)s) AND state = 'queued' AND name = %(name)s",
        "WHERE id = ANY(%(ids)s) AND name = %(name)s",
        (
            FENCES + "::test_claim_takes_only_queued_rows",
            FENCES + "::test_claim_refuses_a_running_id_claimed_again_by_its_own_pool",
        ),
        "a running or scheduled id is claimed again: a job runs twice",
    ),
    Guard(
        "claim-type",
        "src/hivejobs/store/jobs.sql",
        "WHERE id = ANY(%(ids)s) AND state = 'queued' AND name = %(name)s",
        "WHERE id = ANY(%(ids)s) AND state = 'queued'",
        ("tests/integration/test_isolation.py::test_claim_takes_only_the_pools_own_type",),
        "an id pushed into a foreign list runs under another type's handler",
    ),
    Guard(
        "claim-expiry",
        "src/hivejobs/store/jobs.sql",
        "   AND (expires_at IS NULL OR expires_at > now())\n   -- Flow control",
        "   -- Flow control",
        (FENCES + "::test_claim_takes_only_queued_rows",),
        "a job past its expires_at starts",
    ),
    Guard(
        "claim-paused",
        "src/hivejobs/store/jobs.sql",
        "   AND NOT EXISTS (SELECT 1 FROM hivejobs_flow f WHERE f.name = %(name)s AND f.paused)",
        "",
        ("tests/integration/test_flow.py::test_a_paused_type_claims_nothing_and_its_ids_go_back",),
        "a paused type starts jobs",
    ),
    # -- the ends of a claim, fenced by its token --------------------------------------------
    Guard(
        "archive-fence",
        "src/hivejobs/store/jobs.sql",
        " AND j.claim_token = c.token\n    RETURNING j.*, c.final_state",
        "\n    RETURNING j.*, c.final_state",
        (
            FENCES + "::test_a_stale_claims_completion_writes_nothing[succeeded-0.0]",
            FENCES + "::test_a_stale_claims_completion_writes_nothing[failed-0.0]",
        ),
        "a completion from an old claim archives the job another worker now holds",
    ),
    Guard(
        "requeue-fence",
        "src/hivejobs/store/jobs.sql",
        " AND j.claim_token = c.token\nRETURNING j.id, j.name, j.priority, j.state;",
        "\nRETURNING j.id, j.name, j.priority, j.state;",
        (
            FENCES + "::test_a_stale_claims_completion_writes_nothing[retry-0.0]",
            FENCES + "::test_a_stale_claims_completion_writes_nothing[suspend-0.0]",
        ),
        "a retry from an old claim requeues the job another worker runs: it runs twice",
    ),
    Guard(
        "release-fence",
        "src/hivejobs/store/jobs.sql",
        " AND j.claim_token = c.token\n   AND j.worker_id = %(worker_id)s\nRETURNING j.id,",
        "\n   AND j.worker_id = %(worker_id)s\nRETURNING j.id,",
        (FENCES + "::test_a_stale_claims_release_writes_nothing",),
        "a pool releases a claim it no longer holds: the job runs twice",
    ),
    Guard(
        "release-holder-fence",
        "src/hivejobs/store/jobs.sql",
        "c.token\n   AND j.worker_id = %(worker_id)s\nRETURNING j.id,",
        "c.token\nRETURNING j.id,",
        (
            FENCES + "::test_a_claim_ended_awaiting_its_callback_is_not_released",
            FENCES + "::test_a_stale_claims_release_writes_nothing",
        ),
        "a pool releases a callback job whose claim just ended: it runs again, its answer refused",
    ),
    Guard(
        "release-unstarted-mine",
        "src/hivejobs/store/jobs.sql",
        "WHERE id = ANY(%(ids)s) AND worker_id = %(worker_id)s AND state = 'running'",
        "WHERE id = ANY(%(ids)s) AND state = 'running'",
        (FENCES + "::test_release_unstarted_takes_back_only_this_workers_running_claims",),
        "a claim of unknown outcome takes back another worker's running job",
    ),
    Guard(
        "drop-duplicate-fence",
        "src/hivejobs/store/jobs.sql",
        "j.state = 'running' AND j.claim_token = %(token)s",
        "j.state = 'running'",
        (FENCES + "::test_a_stale_claim_does_not_drop_an_archived_duplicate",),
        "an old claim deletes the live row another worker holds",
    ),
    Guard(
        "await-callback-fence",
        "src/hivejobs/store/callback_queries.sql",
        " AND j.claim_token = c.token\nRETURNING j.id;",
        "\nRETURNING j.id;",
        (FENCES + "::test_a_stale_claims_completion_writes_nothing[await_callback-0.0]",),
        "an old claim's hand-over frees the job another worker holds from its rescue",
    ),
    # -- cancel ------------------------------------------------------------------------------
    Guard(
        "cancel-waiting-only",
        "src/hivejobs/store/jobs.sql",
        "DELETE FROM hivejobs_job WHERE id = %(id)s AND state IN ('queued', 'scheduled')",
        "DELETE FROM hivejobs_job WHERE id = %(id)s",
        (FENCES + "::test_a_cancel_of_a_running_job_is_a_request_that_its_outcome_answers",),
        "a cancel archives a running job while its handler still runs",
    ),
    Guard(
        "cancel-keeps-success",
        "src/hivejobs/store/jobs.sql",
        "CASE WHEN cancel_requested AND final_state <> 'succeeded' THEN 'cancelled'",
        "CASE WHEN cancel_requested THEN 'cancelled'",
        (FENCES + "::test_a_cancel_of_a_running_job_is_a_request_that_its_outcome_answers",),
        "work that completed is recorded cancelled because a cancel came late",
    ),
    # -- the rescue of dead processes' claims ------------------------------------------------
    Guard(
        "rescue-at-most-once",
        "src/hivejobs/store/workers.sql",
        "   AND delivery = 'at_least_once' AND attempt < attempts AND lost + 1",
        "   AND attempt < attempts AND lost + 1",
        (FENCES + "::test_a_dead_workers_claims_go_where_their_delivery_says",),
        "an at-most-once job that may have started is requeued: it may run twice",
    ),
    Guard(
        "rescue-attempts",
        "src/hivejobs/store/workers.sql",
        "   AND delivery = 'at_least_once' AND attempt < attempts AND lost + 1",
        "   AND delivery = 'at_least_once' AND lost + 1",
        (FENCES + "::test_a_dead_workers_claims_go_where_their_delivery_says",),
        "a job on its last attempt is requeued past its attempts",
    ),
    Guard(
        "rescue-poison",
        "src/hivejobs/store/workers.sql",
        " AND lost + 1 < %(poison_after)s\n",
        "\n",
        (FENCES + "::test_a_dead_workers_claims_go_where_their_delivery_says",),
        "a job that kills its process is requeued for ever",
    ),
    Guard(
        "rescue-cancel",
        "src/hivejobs/store/workers.sql",
        "   AND NOT cancel_requested\nRETURNING id, name, priority;",
        "RETURNING id, name, priority;",
        (FENCES + "::test_a_dead_workers_claims_go_where_their_delivery_says",),
        "a job whose cancel was asked runs again after its worker died",
    ),
    # -- leader-only writes ------------------------------------------------------------------
    Guard(
        "lease-hold",
        "src/hivejobs/store/leases.sql",
        " AND holder = %(holder)s AND term = %(term)s AND expires_at > now()",
        " AND expires_at > now()",
        (
            "tests/integration/test_store_guards.py"
            "::test_guarded_verbs_write_nothing_once_the_lease_is_lost",
            "tests/integration/test_coordinator.py::test_rescue_with_a_stale_term_writes_nothing",
        ),
        "a coordinator that lost its lease keeps writing beside the new leader",
    ),
    Guard(
        "promote-when-due",
        "src/hivejobs/store/maintenance.sql",
        "                       WHERE state = 'scheduled' AND run_at <= now()\n",
        "                       WHERE state = 'scheduled'\n",
        (FENCES + "::test_promotion_takes_only_scheduled_jobs_that_are_due",),
        "a delayed job or a retry's backoff starts early",
    ),
    # -- unique windows ----------------------------------------------------------------------
    Guard(
        "unique-window",
        "src/hivejobs/store/jobs.sql",
        "\n WHERE hivejobs_unique.until <= now()\nRETURNING job_id;",
        "\nRETURNING job_id;",
        (
            "tests/integration/test_unique.py::test_raise_on_duplicate",
            "tests/integration/test_unique.py::test_sixteen_racing_threads_store_one_job",
        ),
        "a second job with the same key is stored inside the window",
    ),
    Guard(
        "unique-states",
        "src/hivejobs/store/enqueue.py",
        "if owner is not None and owner[1] in unique.states:",
        "if owner is not None:",
        ("tests/integration/test_unique.py::test_a_failed_job_or_a_passed_window_frees_the_key",),
        "a failed job keeps its key for the whole window",
    ),
    # -- debounce and coalesce ---------------------------------------------------------------
    Guard(
        "debounce-key-lock",
        "src/hivejobs/store/debounce.sql",
        "INSERT INTO hivejobs_debounce (key, job_id, first_at)\n"
        "VALUES (%(key)s, %(id)s, now())\n"
        "ON CONFLICT (key) DO UPDATE SET key = EXCLUDED.key\n"
        "RETURNING job_id, first_at;",
        "WITH ins AS (INSERT INTO hivejobs_debounce (key, job_id, first_at)\n"
        "VALUES (%(key)s, %(id)s, now())\n"
        "ON CONFLICT (key) DO NOTHING RETURNING job_id, first_at)\n"
        "SELECT job_id, first_at FROM ins UNION ALL\n"
        "SELECT job_id, first_at FROM hivejobs_debounce WHERE key = %(key)s LIMIT 1;",
        (DEBOUNCE + "::test_sixteen_racing_threads_make_one_job_with_the_last_payload",),
        "racing enqueuers of one key decide without its lock: two waiting jobs for a key",
    ),
    Guard(
        "debounce-not-started",
        "src/hivejobs/store/debounce.sql",
        " WHERE j.id = %(owner)s AND j.state IN ('scheduled', 'queued') AND j.started_at IS NULL",
        " WHERE j.id = %(owner)s AND j.state IN ('scheduled', 'queued')",
        (DEBOUNCE + "::test_a_started_or_cancelled_job_opens_a_new_window",),
        "an enqueue rewrites the payload of a job that already started (a retry waiting)",
    ),
    Guard(
        "coalesce-not-started",
        "src/hivejobs/store/debounce.sql",
        " WHERE id = %(owner)s AND state IN ('scheduled', 'queued') AND started_at IS NULL\n",
        " WHERE id = %(owner)s AND state IN ('scheduled', 'queued', 'running')\n",
        (DEBOUNCE + "::test_coalesce_in_the_callers_transaction_and_async",),
        "an enqueue is merged into a running job, whose handler never sees it",
    ),
    Guard(
        "debounce-max-wait",
        "src/hivejobs/store/debounce.sql",
        "%(first_at)s::timestamptz + %(max_wait_s)s::float8 * interval '1 second'",
        "NULL::timestamptz",  # least() ignores it: no cap
        (DEBOUNCE + "::test_the_run_waits_for_quiet_within_max_wait",),
        "a key enqueued without pause never runs",
    ),
    Guard(
        "debounce-quiet-floor",
        "src/hivejobs/store/debounce.sql",
        "greatest(run_at, now() + %(within_s)s * interval '1 second')",
        "now() + %(within_s)s * interval '1 second'",
        (DEBOUNCE + "::test_debounce_in_the_callers_transaction",),
        "a late lock holder moves the run before another enqueue's quiet time",
    ),
    Guard(
        "debounce-dispatch-on-commit",
        "src/hivejobs/store/enqueue.py",
        'if in_caller and joined.created and joined.state == "queued":',
        "if False:",
        (DEBOUNCE + "::test_a_due_job_made_in_a_transaction_is_dispatched_on_commit",),
        "a job a transaction's enqueue made due waits for the coordinator's repair to run",
    ),
    Guard(
        "debounce-prune-live",
        "src/hivejobs/store/debounce.sql",
        "     WHERE NOT EXISTS (SELECT 1 FROM hivejobs_job j",
        "     WHERE true OR NOT EXISTS (SELECT 1 FROM hivejobs_job j",
        (DEBOUNCE + "::test_a_started_or_cancelled_job_opens_a_new_window",),
        "the pruner drops the key of a waiting job: the next enqueue stores a second one",
    ),
    # -- the pool process --------------------------------------------------------------------
    Guard(
        "memory-cap",
        "src/hivejobs/worker/memory.py",
        "return self.seen_mb > self.max_rss_mb",
        "return False",
        (
            "tests/process/test_memory_cap.py"
            "::test_a_pool_over_its_memory_cap_is_recycled_without_losing_jobs[async]",
        ),
        "a pool of async def handlers grows past max_rss_mb and is never recycled",
    ),
    # -- the executor's outcome mapping ------------------------------------------------------
    Guard(
        "backoff-per-attempt",
        "src/hivejobs/worker/executor.py",
        "return failed(job, ctx, text, jt.backoff.delay_s(job.attempt),",
        "return failed(job, ctx, text, jt.backoff.delay_s(1),",
        (EXECUTOR + "::test_the_retry_delay_is_the_backoff_of_the_attempt_that_failed[raises]",),
        "every retry waits the first attempt's delay: no backoff",
    ),
    Guard(
        "retry-backoff-per-attempt",
        "src/hivejobs/worker/executor.py",
        "else jt.backoff.delay_s(job.attempt)",
        "else jt.backoff.delay_s(1)",
        (
            EXECUTOR + "::test_the_retry_delay_is_the_backoff_of_the_attempt_that_failed"
            "[Retry without a delay]",
        ),
        "Retry() without a delay waits the first attempt's delay every time",
    ),
    Guard(
        "retry-delay",
        "src/hivejobs/worker/executor.py",
        "delay = exc.delay if exc.delay is not None else jt.backoff.delay_s(job.attempt)",
        "delay = jt.backoff.delay_s(job.attempt)",
        (
            "tests/process/test_job_operations.py"
            "::test_fail_retry_and_errors_end_attempts_as_the_handler_says[async]",
        ),
        "Retry(delay=...) from an async def handler in a real pool waits the backoff instead",
    ),
    Guard(
        "attempts-left",
        "src/hivejobs/worker/executor.py",
        "    if job.attempt < job.attempts:\n",
        "    if True:\n",
        (EXECUTOR + "::test_execute_outcomes[raises, last attempt]",),
        "a job is retried past its attempts",
    ),
    Guard(
        "cancel-beats-retry",
        "src/hivejobs/worker/executor.py",
        '    if ctx.cancelled:\n        _say(ctx, "INFO", MSG_CANCELLED',
        '    if False:\n        _say(ctx, "INFO", MSG_CANCELLED',
        (
            "tests/integration/test_lifecycle.py"
            "::test_cancel_running_job_sets_stopping_and_it_ends_cancelled",
        ),
        "a cancelled job that raised is retried",
    ),
    Guard(
        "shutdown-at-most-once",
        "src/hivejobs/worker/executor.py",
        "        if at_most_once:\n",
        "        if False:\n",
        (EXECUTOR + "::test_execute_outcomes[Interrupted at shutdown, amo]",),
        "an at-most-once job interrupted by a shutdown is suspended and runs again",
    ),
    Guard(
        "stop-at-most-once",
        "src/hivejobs/worker/executor.py",
        '    if started and job.delivery == "at_most_once":\n',
        "    if False:\n",
        (
            "tests/unit/test_worker_parts.py"
            "::test_a_stop_suspends_unless_an_at_most_once_job_may_have_started",
        ),
        "an at-most-once job a stop takes back after it started runs again",
    ),
    # -- the HTTP API's token guard ----------------------------------------------------------
    Guard(
        "cancel-admin",
        "src/hivejobs/web/api.py",
        '    operation_id="cancel_job",\n    opt=ADMIN,\n',
        '    operation_id="cancel_job",\n',
        (READ_REFUSED + "[DELETE /v1/jobs/{name:str}/{job_id:str}]",),
        "a read token cancels jobs",
    ),
    Guard(
        "pause-admin",
        "src/hivejobs/web/flow.py",
        '    operation_id="pause_job_type",\n    opt=ADMIN,\n',
        '    operation_id="pause_job_type",\n',
        (READ_REFUSED + "[POST /v1/jobtypes/{name:str}/pause]",),
        "a read token pauses a job type fleet-wide",
    ),
    Guard(
        "guard-admin-role",
        "src/hivejobs/web/asgi.py",
        '    if handler.opt.get("admin") and role != "admin":',
        "    if False:",
        (READ_REFUSED + "[POST /v1/jobs/{name:str}]",),
        "a read token may do everything an admin token does",
    ),
    Guard(
        "guard-token-needed",
        "src/hivejobs/web/asgi.py",
        "    if role is None:\n        raise NotAuthorizedException(",
        "    if False:\n        raise NotAuthorizedException(",
        (TOKEN_NEEDED + "[GET /v1/jobtypes]",),
        "a request without a token reads everything",
    ),
    Guard(
        "unknown-token-refused",
        "src/hivejobs/web/auth.py",
        'return "admin" if admin else ("read" if read else ("callback" if callback else None))',
        'return "admin" if admin else "read"',
        (TOKEN_NEEDED + "[GET /v1/jobtypes]",),
        "any token at all is a read token",
    ),
    # -- the HTTP surface's least privilege and bad input ------------------------------------
    Guard(
        "callback-token-own-type",
        "src/hivejobs/web/asgi.py",
        '        if not handler.opt.get("callback") or name not in tokens.callback_types(',
        "        if False and (",
        (CALLBACK_ROLE + "::test_a_callback_token_posts_its_types_callbacks_and_nothing_else",),
        "a callback token reads, enqueues, cancels, replays, pauses and scales",
    ),
    Guard(
        "callback-signature",
        "src/hivejobs/web/auth.py",
        "        return ok\n",
        "        return True\n",
        (CALLBACK_ROLE + "::test_a_callback_token_posts_its_types_callbacks_and_nothing_else",),
        "a callback of a type with a secret is taken without the body's HMAC",
    ),
    Guard(
        "nul-parameter-refused",
        "src/hivejobs/web/asgi.py",
        "        before_request=inputs.refuse_nul,\n",
        "",
        (HARDENING + "::test_nul_and_deep_input_is_a_4xx_naming_the_field",),
        "a NUL in ?type= or a path is a 500 with a traceback per request",
    ),
    Guard(
        "stop-deadlock-retried",
        "src/hivejobs/store/chains.py",
        "STOP_TRIES = 5\n",
        "STOP_TRIES = 1\n",
        (HARDENING + "::test_a_stop_that_deadlocks_is_retried_inside",),
        "a chain stop that deadlocks with the traverser is a 503",
    ),
    Guard(
        "backend-503-unnamed",
        "src/hivejobs/web/errors.py",
        "    if isinstance(exc, ConnectionFailed):\n",
        "    if False:\n",
        (HARDENING + "::test_a_503_with_postgres_down_names_no_server",),
        "a 503 names the database's user, host, port and name",
    ),
    Guard(
        "error-kind-too-large",
        "src/hivejobs/errors.py",
        '    {"usage", "invalid", "unknown_type", "too_large", "id_conflict"}',
        '    {"usage", "invalid", "unknown_type", "id_conflict"}',
        ("tests/process/test_cli_bad_input.py::test_cli_bad_input_is_one_line_and_stores_nothing",),
        "an oversize payload on the command line exits 1, as a failure of ours, not 2",
    ),
    Guard(
        "error-kind-unknown-type",
        "src/hivejobs/errors.py",
        'kind: ClassVar[ErrorKind] = "unknown_type"',
        'kind: ClassVar[ErrorKind] = "failed"',
        (
            "tests/web/test_api.py::test_put_is_idempotent_post_creates_and_bad_input_stores_nothing",
        ),
        "the API answers an unknown job type with 400, not 404",
    ),
    Guard(
        "push-hint-swallowed",
        "src/hivejobs/broker/hints.py",
        "        if not isinstance(exc, redis.RedisError):\n",
        "        if not isinstance(exc, ZeroDivisionError):\n",
        (
            "tests/integration/test_push_hints.py"
            "::test_a_refused_push_is_logged_for_the_reconciler_and_not_raised",
        ),
        "a push of committed jobs that Redis refuses raises into a caller whose act succeeded",
    ),
    Guard(
        "healthz-reused",
        "src/hivejobs/web/fleet.py",
        "Reused(app.settings.probe_cache_s,",
        "Reused(0.0,",
        ("tests/web/test_probes.py::test_healthz_reuses_its_answer",),
        "every public /healthz is a Postgres and a Redis round trip",
    ),
    Guard(
        "dashboard-autoescape",
        "src/hivejobs/web/render.py",
        "        autoescape=True,\n",
        "        autoescape=False,\n",
        ("tests/web/test_dashboard_escaping.py",),
        "markup in an error, a payload or a chain's name becomes elements on the dashboard",
    ),
    Guard(
        "chain-page-paginated",
        "src/hivejobs/web/dashboard.py",
        "    shown = status.jobs[(page - 1) * CHAIN_PAGE : page * CHAIN_PAGE]\n",
        "    shown = status.jobs\n",
        ("tests/web/test_chain_page.py::test_a_huge_chain_page_is_paginated",),
        "a 20,000-job chain is one page of megabytes, re-fetched every two seconds",
    ),
    # -- what is stored and accepted ---------------------------------------------------------
    Guard(
        "stored-text-scrubbed",
        "src/hivejobs/serialization.py",
        "raw = _utf8(scrub_known(text).replace(",
        "raw = _utf8((text).replace(",
        ("tests/process/test_stored_secrets.py::test_no_stored_text_keeps_the_password",),
        "a DSN a handler raises is stored in clear in the job's error",
    ),
    Guard(
        "run-at-bounded",
        "src/hivejobs/jobtypes.py",
        "            check_run_at(run_at)\n",
        "            pass\n",
        ("tests/integration/test_run_at_bounds.py",),
        "a run_at in year 1 or 9999 is stored",
    ),
    Guard(
        "embedded-shared-account-refused",
        "src/hivejobs/embedded/postgres.py",
        "    if name in SHARED_ACCOUNTS or pw.pw_uid in _shared_uids():\n",
        "    if False:\n",
        ("tests/process/test_embedded_user.py::test_a_shared_account_is_refused",),
        "the embedded servers run as nobody, whose other processes read their passwords",
    ),
    # -- chain ordering ----------------------------------------------------------------------
    Guard(
        "chain-every-predecessor",
        "src/hivejobs/coordinator/traverser.py",
        'return all(snap.jobs[k].state == "succeeded" for k in row.after_keys)',
        'return any(snap.jobs[k].state == "succeeded" for k in row.after_keys)',
        (ORDERING,),
        "a job starts once one of its predecessors succeeded",
    ),
    Guard(
        "chain-predecessor-succeeded",
        "src/hivejobs/coordinator/traverser.py",
        'return all(snap.jobs[k].state == "succeeded" for k in row.after_keys)',
        'return all(snap.jobs[k].state != "pending" for k in row.after_keys)',
        (ORDERING,),
        "a job starts once its predecessors started (or failed), not succeeded",
    ),
    Guard(
        "chain-start-ordered",
        "src/hivejobs/coordinator/traverser.py",
        'if row.state != "pending" or not _preds_succeeded(snap, row):',
        'if row.state != "pending":',
        (ORDERING,),
        "every pending job starts at once, whatever its predecessors did",
    ),
    Guard(
        "fair-turn",
        "src/hivejobs/broker/fair.py",
        "        back[#back + 1] = turn\n",
        "        back[#back + 1] = score\n",
        (FAIR + "::test_a_key_behind_a_backlog_gets_its_turn_in_the_next_round",),
        "a key served keeps its place at the ring's head: the keys behind it starve",
    ),
    Guard(
        "fair-weight",
        "src/hivejobs/broker/fair.py",
        "or weights[key] or 1",
        "or 1",
        (FAIR + "::test_weights_give_a_key_that_many_jobs_per_turn",),
        "fair_weights are ignored",
    ),
    Guard(
        "fair-ring-membership",
        "src/hivejobs/broker/fair.py",
        "  if not redis.call('ZSCORE', ring, key) then",
        "  if redis.call('LLEN', prefix .. ARGV[i] .. ':' .. key) == 1 then",
        (FAIR + "::test_a_lost_ring_is_repaired_from_postgres",),
        "a key whose list outlived a lost ring never rejoins it: its jobs wait for ever",
    ),
    Guard(
        "fair-wake",
        "src/hivejobs/broker/fair.py",
        "redis.call('RPUSH', wake, 1)\n",
        "",
        (FAIR + "::test_a_pool_waiting_on_an_empty_type_wakes_for_jobs_placed_by_enqueue_many",),
        "jobs placed by enqueue_many wait out an idle pool's blocking pop",
    ),
    Guard(
        "fair-sort-every-list",
        "src/hivejobs/broker/fair.py",
        "moved += self._place(_ids(reply[1]), keys_of)  # type: ignore[arg-type]\n",
        "moved += self._place(_ids(reply[1]), keys_of)  # type: ignore[arg-type]\n"
        "                break\n",
        (
            "tests/process/test_fair_run.py"
            "::test_fair_and_limited_on_one_field_runs_everything_one_per_key",
        ),
        "refused ids coming back to one priority's inbox keep another priority's unsorted",
    ),
    Guard(
        "fair-held-lists",
        "src/hivejobs/coordinator/reconciler.py",
        "        if row.key in held:\n",
        "        if False:\n",
        (FAIR + "::test_the_reconciler_counts_per_key_lists_as_held",),
        "the reconciler takes a fair type's sorted backlog for lost and pushes it again",
    ),
    Guard(
        "fair-held-per-key",
        "src/hivejobs/coordinator/reconciler.py",
        "            head_at = held[row.key]\n",
        "            head_at = min((h for h in held.values() if h), default=None)\n",
        (FAIR + "::test_a_lost_id_is_found_by_its_own_key_while_an_older_backlog_waits",),
        "a key's lost id waits until every other key's older backlog is served",
    ),
    Guard(
        "fair-held-inbox",
        "src/hivejobs/coordinator/reconciler.py",
        "        if inbox_at is not None and row.queued_at >= inbox_at - grace:\n",
        "        if False:\n",
        (FAIR + "::test_ids_waiting_unsorted_in_the_inbox_are_held",),
        "ids waiting unsorted in the inbox are pushed again at every pass",
    ),
    Guard(
        "fair-held-reachable",
        "src/hivejobs/broker/fair.py",
        "        if isinstance(score, Exception) or score is None:\n",
        "        if isinstance(score, Exception):\n",
        (FAIR + "::test_a_lost_ring_is_repaired_from_postgres",),
        "a list off the ring counts as held: its ids wait for ever",
    ),
    Guard(
        "fair-repair-pages",
        "src/hivejobs/coordinator/reconciler.py",
        "            if len(lost) < len(rows) or len(rows) < FAIR_PAGE:\n",
        "            if True:\n",
        (FAIR + "::test_a_lost_ring_of_many_keys_is_repaired_in_one_pass",),
        "a lost ring of many keys is repaired a page of keys per pass",
    ),
    Guard(
        "fair-payload-key",
        "src/hivejobs/jobtypes.py",
        "            self.fair.check_payload(self.name, decode_json(encoded))",
        "            pass",
        (FAIR + "::test_a_payload_without_a_usable_key_is_refused_and_nothing_stored",),
        "a payload without the fair_by field is stored (under the '' key)",
    ),
    # -- sequences per key ---------------------------------------------------------------
    Guard(
        "seq-claim-running",
        "src/hivejobs/store/sequence.sql",
        "        AND NOT EXISTS (SELECT 1 FROM hivejobs_job r\n"
        "                         WHERE r.name = j.name AND r.seq_key = j.seq_key\n"
        "                           AND r.state = 'running')\n",
        "",
        (SEQ + "::test_a_job_numbered_first_still_waits_for_the_running_one",),
        "a key's job starts while another of the key runs",
    ),
    Guard(
        "seq-claim-earlier",
        "src/hivejobs/store/sequence.sql",
        "        AND NOT EXISTS (SELECT 1 FROM hivejobs_job b\n"
        "                         WHERE b.name = j.name AND b.seq_key = j.seq_key"
        " AND b.seq < j.seq)\n",
        "",
        (SEQ + "::test_a_later_job_never_starts_while_an_earlier_one_is_live",),
        "a key's later job starts while an earlier one waits: out of order",
    ),
    Guard(
        "seq-completer-push",
        "src/hivejobs/store/jobs.py",
        "            requeued += handed_over(conn, archived)\n",
        "            pass\n",
        (SEQ + "::test_the_completion_that_ends_a_key_pushes_the_job_it_handed_the_key_to",),
        "a hand-over waits for a NOTIFY (none behind a pooler without a listen URL: seconds)",
    ),
    Guard(
        "seq-completer-push-exact",
        "src/hivejobs/store/sequence.sql",
        " WHERE n.state = 'queued' AND n.queued_at = %(at)s;",
        " WHERE n.state = 'queued';",
        (SEQ + "::test_the_completion_that_ends_a_key_pushes_the_job_it_handed_the_key_to",),
        "a next job still in Redis is pushed again at every hand-over (a duplicate each)",
    ),
    Guard(
        "seq-completer-no-notify",
        "src/hivejobs/store/jobs.sql",
        " WHERE seq_key IS NULL OR set_config('hivejobs.hand_over_push', 'pool', true) = 'pool';",
        ";",
        (SEQ + "::test_a_pools_completion_hands_over_without_a_notify_other_endings_with_one",),
        "every completer hand-over is pushed twice (its push and the NOTIFY's)",
    ),
    Guard(
        "seq-gauge-parked",
        "src/hivejobs/coordinator/gauges.py",
        "        queued = dict(self._parked)\n",
        "        queued: dict[str, int] = {}\n",
        (SEQ + "::test_the_queue_depth_gauge_counts_jobs_parked_behind_their_key",),
        "the queue-depth gauge misses the jobs parked behind their keys",
    ),
    Guard(
        "seq-prune-skip-locked",
        "src/hivejobs/store/sequence.sql",
        "   FOR UPDATE OF s SKIP LOCKED;",
        "   FOR UPDATE OF s;",
        (SEQ_PRUNE + "::test_an_enqueue_holding_the_counter_keeps_it_and_the_key_numbers_on",),
        "the pruner waits on a caller's open transaction that enqueues",
    ),
    Guard(
        "seq-prune-live",
        "src/hivejobs/store/sequence.sql",
        SEQ_PRUNE_SQL,
        SEQ_PRUNE_SQL.replace(
            "   AND NOT EXISTS (SELECT 1 FROM hivejobs_job j WHERE j.name = s.name"
            " AND j.seq_key = s.key)\n",
            "",
        ),
        (
            SEQ_PRUNE + "::test_only_idle_keys_lose_their_counter",
            SEQ_PRUNE + "::test_an_enqueue_holding_the_counter_keeps_it_and_the_key_numbers_on",
        ),
        "a key with live jobs loses its counter: its next job numbers before them",
    ),
    Guard(
        "seq-prune-hold",
        "src/hivejobs/store/sequence.sql",
        SEQ_PRUNE_SQL,
        SEQ_PRUNE_SQL.replace(
            "   AND NOT EXISTS (SELECT 1 FROM hivejobs_sequence_hold h\n"
            "                    WHERE h.name = s.name AND h.key = s.key)\n",
            "",
        ),
        (SEQ_PRUNE + "::test_only_idle_keys_lose_their_counter",),
        "a held key loses its counter while its hold waits for an operator",
    ),
    Guard(
        "seq-prune-place",
        "src/hivejobs/store/sequence.sql",
        SEQ_PRUNE_SQL,
        SEQ_PRUNE_SQL.replace(
            "   AND NOT EXISTS (SELECT 1 FROM hivejobs_sequence_place p\n"
            "                    WHERE p.name = s.name AND p.key = s.key)\n",
            "",
        ),
        (SEQ_CHAIN + "::test_the_prune_keeps_a_key_whose_step_is_between_tries",),
        "a key whose chain step waits for its retry loses its counter: a later job numbers "
        "before the step",
    ),
    # -- sequenced chain steps: one place in the key's line for all the chain's tries ----
    Guard(
        "seq-chain-step-key",
        "src/hivejobs/chains/checks.py",
        "        seq_key = None if jt.sequence is None else jt.sequence.key(jt.name, payload)",
        "        seq_key = None",
        (SEQ_RETRY,),
        "a sequenced chain step runs outside its key's line",
    ),
    Guard(
        "seq-claim-place",
        "src/hivejobs/store/sequence.sql",
        "        AND NOT EXISTS (SELECT 1 FROM hivejobs_sequence_place p\n"
        "                         WHERE p.name = j.name AND p.key = j.seq_key"
        " AND p.seq < j.seq)))",
        "        AND true))",
        (SEQ_RETRY,),
        "a later job of the key starts while a chain step waits for its retry",
    ),
    Guard(
        "seq-park-place",
        "src/hivejobs/store/sequence.sql",
        "        OR EXISTS (SELECT 1 FROM hivejobs_sequence_place p\n"
        "                    WHERE p.name = j.name AND p.key = j.seq_key AND p.seq < j.seq))",
        "        OR false)",
        (SEQ_CHAIN + "::test_the_prune_keeps_a_key_whose_step_is_between_tries",),
        "a job refused for a step's place stays dispatched: popped and refused again and again",
    ),
    Guard(
        "seq-hand-over-place",
        SEQ_PLACE_MIGRATION,
        "                WHERE p.name = p_name AND p.key = p_key AND p.seq < nxt.seq) THEN",
        "                WHERE false) THEN",
        (SEQ_RETRY,),
        "a failed try of a chain step hands its key to the next job before the chain's retry",
    ),
    Guard(
        "seq-stalled-place",
        "src/hivejobs/store/sequence.sql",
        "   AND NOT EXISTS (SELECT 1 FROM hivejobs_sequence_place p\n"
        "                    WHERE p.name = k.name AND p.key = k.seq_key AND p.seq < nxt.seq)",
        "",
        (SEQ_RETRY,),
        "the sequencer's repair unparks a job behind a chain step that waits for its retry",
    ),
    Guard(
        "seq-place-kept-by-retry",
        "src/hivejobs/store/traversal.sql",
        "                        WHERE p.chain_id = %(chain_id)s AND p.step = u.step)\n), n AS (",
        "                        WHERE false)\n), n AS (",
        (SEQ_RETRY,),
        "a chain's retry of a step takes a new place at the end of its key's line",
    ),
    Guard(
        "seq-place-success",
        SEQ_PLACE_MIGRATION,
        "     WHERE g.seq_key IS NOT NULL AND a.state = 'succeeded'\n",
        "     WHERE false\n",
        (SEQ_RETRY,),
        "a step's success hands its key on only when the traverser comes by (a hop later)",
    ),
    Guard(
        "seq-place-hold",
        SEQ_PLACE_MIGRATION,
        "     WHERE u.hold AND cj.job_id IS NOT NULL\n",
        "     WHERE false\n",
        (SEQ_CHAIN + "::test_a_step_failed_for_good_holds_or_hands_on_its_key",),
        "a chain step failed for good under on_failure=hold lets its key go on",
    ),
    Guard(
        "seq-place-chain-end",
        "src/hivejobs/coordinator/traverser.py",
        '        elif chain_ends or row.state == "succeeded":',
        '        elif row.state == "succeeded":',
        (
            SEQ_PLACES,
            SEQ_CHAIN + "::test_stopping_the_chain_between_tries_gives_the_key_on_without_a_hold",
        ),
        "a stopped or failed chain keeps its waiting step's place: the key is stuck for good",
    ),
    Guard(
        "seq-place-sequence-retry",
        "src/hivejobs/coordinator/traverser.py",
        "(chain_ends or not _sequence_retries_left(snap, row))",
        "True",
        (
            SEQ_PLACES,
            SEQ_CHAIN + "::test_a_chain_sequence_retry_of_the_failed_step_keeps_its_place",
        ),
        "a step whose chain sequence will retry it gives up its place (and holds the key)",
    ),
    Guard(
        "seq-place-stop-no-hold",
        "src/hivejobs/coordinator/traverser.py",
        "            plan.end_places[row.key] = row.seq_hold and not snap.stop_requested",
        "            plan.end_places[row.key] = row.seq_hold",
        (SEQ_PLACES,),
        "stopping a chain holds its step's key when a try failed during the stop",
    ),
    Guard(
        "seq-place-lock-timeout",
        "src/hivejobs/store/traversal.sql",
        "       set_config('lock_timeout', %(timeout_ms)s, true);",
        "       set_config('lock_timeout', '0', true);",
        (SEQ_CHAIN + "::test_an_enqueuers_open_transaction_delays_the_step_not_the_other_chains",),
        "the traverser waits for a caller's open transaction that enqueued a step's key",
    ),
    Guard(
        "seq-place-lock-busy",
        "src/hivejobs/store/traversal.py",
        "            raise LockBusy(chain_id) from None",
        "            raise",
        (SEQ_CHAIN + "::test_an_enqueuers_open_transaction_delays_the_step_not_the_other_chains",),
        "a step's busy key counter aborts the traverser's pass: the other chains wait",
    ),
    Guard(
        "seq-prune-retention",
        "src/hivejobs/store/sequence.sql",
        SEQ_PRUNE_SQL,
        SEQ_PRUNE_SQL.replace(
            " WHERE s.used_at < now() - %(retention_s)s * interval '1 second'\n   AND", " WHERE"
        ).replace("   AND s.used_at < now() - %(retention_s)s * interval '1 second'\n", ""),
        (SEQ_PRUNE + "::test_only_idle_keys_lose_their_counter",),
        "a key's counter goes before its retention",
    ),
)


def guards_named(names: str | None) -> list[Guard]:
    if not names:
        return list(GUARDS)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {g.name: g for g in GUARDS}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise SystemExit(f"unknown guard(s): {', '.join(unknown)} (see --list)")
    return [known[n] for n in wanted]


def occurrences(guard: Guard, root: Path = ROOT) -> int:
    return (root / guard.path).read_text().count(guard.find)


def copy_tree(into: Path) -> None:
    for name in COPIED:
        shutil.copytree(ROOT / name, into / name, ignore=IGNORED)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, into / name)


def run_tests(copy: Path, tests: list[str]) -> tuple[int, str, float]:
    """pytest over `tests` in the copy: (exit status, its last lines, seconds)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(copy / "src"), str(copy)])
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a restored file must never run from a stale .pyc
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-W", "ignore"]
    started = time.monotonic()
    try:
        done = subprocess.run(
            [*cmd, *tests],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return -1, f"no answer in {RUN_TIMEOUT_S:.0f} s", time.monotonic() - started
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-3:])
    return done.returncode, tail, time.monotonic() - started


def first_failure(tail: str) -> str:
    found = re.search(r"^FAILED (.+?)(?: - .*)?$", tail, re.MULTILINE)
    return found.group(1) if found else tail.splitlines()[-1] if tail else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print the guards and exit")
    parser.add_argument("--only", metavar="NAME[,NAME...]", help="run just these guards")
    args = parser.parse_args()
    guards = guards_named(args.only)
    if args.list:
        for g in guards:
            print(f"{g.name:28} {g.path}\n{'':28} {g.why}")
            for t in g.tests:
                print(f"{'':28}   {t}")
        return 0
    misplaced = [g.name for g in guards if occurrences(g) != 1]
    if misplaced:
        print(f"guard text not found exactly once: {', '.join(misplaced)}")
        return 1
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hivejobs-mutants-") as tmp:
        copy = Path(tmp)
        copy_tree(copy)
        every = sorted({t for g in guards for t in g.tests})
        status, tail, took = run_tests(copy, every)
        print(f"baseline: {len(every)} test ids, exit {status}, {took:.0f} s")
        if status != 0:
            print(tail)
            return 1
        survivors, errors = [], []
        for g in guards:
            target = copy / g.path
            original = target.read_text()
            target.write_text(original.replace(g.find, g.replace, 1))
            try:
                status, tail, took = run_tests(copy, list(g.tests))
            finally:
                target.write_text(original)
            if status == 0:
                verdict = "SURVIVED"
                survivors.append(g.name)
            elif status == 1:
                verdict = "killed by " + first_failure(tail)
            else:
                verdict = f"ERROR (exit {status}): {tail.splitlines()[-1] if tail else ''}"
                errors.append(g.name)
            print(f"{g.name:28} {took:6.1f} s  {verdict}", flush=True)
    total = time.monotonic() - started
    print(
        f"{len(guards)} guards, {len(guards) - len(survivors) - len(errors)} killed, "
        f"{len(survivors)} survived, {len(errors)} errors, {total:.0f} s"
    )
    if survivors:
        print("survived: " + ", ".join(survivors))
    return 1 if survivors or errors else 0


if __name__ == "__main__":
    sys.exit(main())
