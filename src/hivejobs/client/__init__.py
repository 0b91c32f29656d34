"""The client side: the `App` facade and what only it uses.

  app.py           App: enqueue (sync and async), job reads, lifecycle, and JobContext (a
                   handler's view of its job: the App, its chain and batch); its other calls come
                   from the role classes below (its bases)
  registry.py      Registry: @app.job, periodic, on_process_start, and the declaration checks
  control.py       Control: cancel, status callbacks, pause/resume/scale, keys, replay
  streaming.py     Streams: wait, stream and progress of a job (and the event streams)
  chains.py        ChainCalls over ChainClient: run, status, stop, listings
  batches.py       BatchCalls, Batch and AsyncBatch
  core.py          Core: the App's plumbing (connections, declared types, the enqueue sides)
  enqueue.py       the enqueue pipeline: one plan, run over a sync or an async side
  connections.py   the App's Postgres and Redis, opened on first use (sync)
  aio.py           the same for the async API
  integrations.py  enqueue inside a caller's SQLAlchemy or Django transaction
  listing.py       job listings and their filters (also parsed by the CLI)
  waiting.py       wait for a job to end (LISTEN, else polling)
  inline.py        App(testing="inline"): jobs run at once in the caller, no servers

May import the worker, coordinator and chains packages and everything below them (store,
broker, records, errors, config); never cli, web, bench, dev or testing. Nothing is imported
here: `hivejobs` re-exports App.
"""
