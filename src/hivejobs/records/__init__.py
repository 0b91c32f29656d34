"""The records every layer shares: msgspec Structs and row tuples, what a job, a chain, a batch
and the fleet are as read from or written to Postgres and Redis, and the Literals of their states.

  jobs.py      a job: its states, the job to insert, a claim and its completion, JobInfo,
               listings (JobSummary, JobPage), job type declarations, replay
  dispatch.py  rows the store hands the broker and the coordinator: Push, claims held, queue
               pages, the coordinator's Lease, what a rescue did
  fleet.py     per-type counts and flow state, worker processes, schedules
  batches.py   a batch as stored and its callback's payload (BatchDone)
  events.py    JobEvent: one event of a job's stream (progress, partial result, end)
  chains.py    a chain and its jobs, a listing's row, the job log, a live try

Imports nothing of ours but its own modules (events.py reads jobs.py's JobState), and
nothing here: import each record from its module; `hivejobs` re-exports the public ones.
"""
