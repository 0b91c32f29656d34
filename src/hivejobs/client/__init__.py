"""The client side: the `App` facade and what only it uses.

  app.py           App: the registry (@app.job), enqueue (sync and async), reads, control
  connections.py   the App's Postgres and Redis, opened on first use (sync)
  aio.py           the same for the async API
  chains.py        ChainClient: the App's chain calls (run, status, stop, listings)
  integrations.py  enqueue inside a caller's SQLAlchemy or Django transaction
  listing.py       job listings and their filters (also parsed by the CLI)
  waiting.py       wait for a job to end (LISTEN, else polling)
  inline.py        App(testing="inline"): jobs run at once in the caller, no servers

May import the worker, coordinator and chains packages and everything below them (store,
broker, records, errors, config); never cli, web, bench, dev or testing. Nothing is imported
here: `hivejobs` re-exports App.
"""
