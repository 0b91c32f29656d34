"""The worker side of `hivejobs run`: the supervisor and the pool processes it forks.

  supervisor.py  fork one process per pool (and the coordinator), restart, shut down
  children.py    the supervisor's children: their records, restart backoff, process groups,
                 the release of a dead child's claims, the metrics child
  process.py     a pool process's composition root: builds the roles below, runs, stops
  fetcher.py     pop ids, claim them in Postgres, prefetch; the claims this process holds
  slots.py       runner slots: reservation, the attempts running, quarantine of suspects
  runner.py      runner threads: take a reserved claim, execute it, hand over the result
  executor.py    the pure `execute(...) -> Completion`, the one place a handler is called
  completer.py   group commit of finished attempts
  watchdog.py    job timeouts: ask to stop, then fail the attempt and recycle the process
  liveness.py    heartbeat, release of untracked claims, control messages
  shutdown.py    the stop state, and the drain by a deadline that reports what it suspended
  exits.py       ChildExit: every exit code of a child, and what the supervisor does
  context.py     AttemptContext: the attempt's stop flag and events (JobContext's base)
  served.py      ServedApp: what the worker needs of the App it serves (a Protocol)
  async_handlers.py  `async def` handlers on the runner's event loop
  capture.py     a job's stdout/stderr and log lines, kept with its attempt
  memory.py      the pool process's RSS cap
  placement.py   which job types run in which process (`pool=`), connection footprint
  banner.py      the start-up banner of `hivejobs run`
  reload.py      `hivejobs run --reload`: restart on source changes
  metrics_server.py  Prometheus exposition and the `--metrics-port` HTTP server

May import coordinator, chains and everything below (jobtypes, flow, store, broker, records,
errors, config); never client, cli, web, bench, dev or testing (the App it serves is
passed in, typed by served.py's Protocol).

This package's `__init__` imports nothing, so that light modules (reload.py, testing)
can import one of its modules without loading the others.
"""
