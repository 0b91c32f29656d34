-- hivejobs schema 21: the W3C trace context (a `traceparent` value) of the span that enqueued
-- a job, or submitted a chain, so that each attempt's span joins the enqueuer's trace
-- (hivejobs/tracing.py). In the row, never in the payload: the payload is the user's, and
-- an idempotent re-enqueue compares payloads. NULL when nothing was traced.
-- Never edited once shipped: a schema change is a new file.
--
-- Nullable and without a default: adding the columns rewrites no row.

ALTER TABLE hivejobs_job ADD COLUMN trace_context text;
ALTER TABLE hivejobs_chain ADD COLUMN trace_context text;
