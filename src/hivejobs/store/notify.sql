-- Postgres LISTEN/NOTIFY: the statements; store/notify.py builds and parses payloads.

-- name: notify_dispatch
-- Jobs enqueued in the caller's transaction: the coordinator pushes their ids once (and only
-- if) that transaction commits, because NOTIFY is delivered on commit. Payloads are built by
-- store/enqueue.py (dispatch_payloads), which also parses them.
SELECT pg_notify('hivejobs_dispatch', p) FROM unnest(%(payloads)s::text[]) AS p;

-- name: listen_dispatch
-- The coordinator's session hears transactional enqueues once they commit (notify_dispatch).
LISTEN hivejobs_dispatch;

-- name: listen_chain
-- ... and chain wake-ups (wake_traverser in chain_queries.sql).
LISTEN hivejobs_chain;
