-- Postgres LISTEN/NOTIFY: the statements; store/notify.py builds and parses the payloads.
-- The coordinator's session LISTENs on hivejobs_dispatch (transactional enqueues, heard once
-- they commit: notify_dispatch) and on hivejobs_chain (wake_traverser in chain_queries.sql).
-- The LISTEN blocks carry no comment and no semicolon: their text is what pg_stat_activity
-- shows, and tests wait for exactly 'LISTEN hivejobs_chain' before they NOTIFY.

-- name: notify_dispatch
-- Jobs enqueued in the caller's transaction: the coordinator pushes their ids once (and only
-- if) that transaction commits, because NOTIFY is delivered on commit. Payloads are built by
-- store/notify.py (dispatch_payloads), which also parses them.
SELECT pg_notify('hivejobs_dispatch', p) FROM unnest(%(payloads)s::text[]) AS p;

-- name: listen_dispatch
LISTEN hivejobs_dispatch

-- name: listen_chain
LISTEN hivejobs_chain
