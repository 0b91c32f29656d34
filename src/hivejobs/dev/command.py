"""``hivejobs dev``: one command from a fresh ``pip install 'hivejobs[dev]'`` to running jobs.

It starts the embedded PostgreSQL + Valkey (see ``hivejobs.embedded``) unless URLs are given
in the environment, prints the line that points other shells at them, migrates the schema and
runs the worker for ``MODULE:APP`` as a subprocess, and stops everything on Ctrl-C/SIGTERM.

The worker is a subprocess (``python -m hivejobs run MODULE:APP``) rather than a thread so
that it runs exactly as in production, and in its own process group so that a Ctrl-C typed in
the terminal reaches only us: we then ask the worker to stop (SIGTERM), wait for it to drain
while the servers are still up, and only then stop the servers. A second Ctrl-C kills it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from loguru import logger

from hivejobs.config import explicit_urls
from hivejobs.embedded.guard import EmbeddedError
from hivejobs.embedded.process import parent_death_preexec
from hivejobs.embedded.servers import EmbeddedServers, export_lines, start_embedded, stop_embedded
from hivejobs.embedded.state import default_data_dir, recorded_urls_match
from hivejobs.urls import redact_url

# How to call our own CLI in a subprocess; a list so that tests can point it at a fake.
HIVEJOBS_COMMAND = [sys.executable, "-m", "hivejobs"]
# Longer than the worker's own shutdown timeout (Settings.shutdown_timeout_s = 25 s).
WORKER_STOP_TIMEOUT_S = 40.0


def _child_env(database_url: str, redis_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(HIVEJOBS_DATABASE_URL=database_url, HIVEJOBS_REDIS_URL=redis_url)
    env.pop("HIVEJOBS_EMBEDDED", None)  # the URLs are explicit now
    return env


class _Signals:
    """Turns SIGINT/SIGTERM into a counter the main loop polls (handlers must stay tiny)."""

    def __init__(self) -> None:
        self.count = 0
        self.event = threading.Event()
        self._old: dict[int, object] = {}

    def received(self) -> int:
        """How many SIGINT/SIGTERM arrived so far (a call, so mypy does not narrow it)."""
        return self.count

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        self.event.set()

    def __enter__(self) -> _Signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)  # type: ignore[arg-type]


def _run_worker(app_spec: str, env: dict[str, str], signals: _Signals, reload: bool = False) -> int:
    """Migrate, then run the worker until it exits or we are told to stop."""
    migrate = subprocess.run(
        [*HIVEJOBS_COMMAND, "migrate", "--app", app_spec], env=env, check=False
    )
    if migrate.returncode != 0:
        logger.error("hivejobs migrate failed with exit code {}", migrate.returncode)
        return migrate.returncode
    if signals.received():
        return 0
    worker = subprocess.Popen(
        [*HIVEJOBS_COMMAND, "run", app_spec, *(["--reload"] if reload else [])],
        env=env,
        process_group=0,  # terminal Ctrl-C reaches us only; we forward one SIGTERM
        preexec_fn=parent_death_preexec(),  # no stray worker if we are SIGKILLed
    )
    forwarded = 0
    deadline: float | None = None
    while True:
        try:
            return worker.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
        if signals.received() > forwarded:
            forwarded = signals.received()
            if forwarded == 1:
                logger.info("stopping the worker (Ctrl-C again to suspend running jobs now)")
                worker.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + WORKER_STOP_TIMEOUT_S
            elif forwarded == 2:
                # The supervisor's "now": jobs are suspended (resumed next start), not killed.
                logger.info("suspending running jobs now (Ctrl-C again to kill the worker)")
                worker.send_signal(signal.SIGINT)
            else:
                worker.kill()
        if deadline is not None and time.monotonic() > deadline:
            logger.warning(
                "worker still running {}s after SIGTERM; killing it", WORKER_STOP_TIMEOUT_S
            )
            worker.kill()
            deadline = None


def _wait_for_signal(servers: EmbeddedServers | None, signals: _Signals) -> int:
    """Keep the servers up until Ctrl-C/SIGTERM; 1 if a server died under us."""
    while not signals.event.wait(0.5):
        if servers is not None and not servers.alive():
            logger.error("an embedded server exited; see the logs in {}", servers.data_dir / "logs")
            return 1
    return 0


def dev_main(
    app_spec: str | None,
    data_dir: str | None,
    print_env: bool,
    *,
    stop: bool = False,
    reload: bool = False,
) -> int:
    """Run ``hivejobs dev [MODULE:APP] [--data-dir DIR] [--print-env] [--stop]``.

    * default: start (or reuse) embedded servers tied to this process, print the export line,
      run ``hivejobs migrate`` and ``python -m hivejobs run MODULE:APP`` if given (else just
      keep the servers up), stop all on Ctrl-C/SIGTERM. Returns the worker's exit code.
    * ``print_env``: start the servers *detached* (own session, no parent-death signal),
      print only the export line (for ``eval "$(hivejobs dev --print-env)"``) and exit. They
      must outlive this command to be of any use to the other shells; a later
      ``hivejobs dev`` on the same data dir reuses them, ``--stop`` stops them.
    * ``stop``: stop the servers recorded in the data dir, whoever started them.

    With HIVEJOBS_DATABASE_URL/HIVEJOBS_REDIS_URL (or DATABASE_URL/REDIS_URL) set, those are
    used and nothing is started.
    """
    ddir = Path(data_dir).expanduser() if data_dir else None
    if stop:
        stopped = stop_embedded(ddir)
        print("embedded servers stopped" if stopped else "no embedded servers were running")
        return 0
    servers: EmbeddedServers | None = None
    explicit = explicit_urls()
    if explicit is not None and recorded_urls_match(ddir or default_data_dir(), *explicit):
        # Our own exported URLs (left set after `--stop`): start those servers again rather
        # than fail to reach them.
        logger.info("the configured URLs are this data dir's embedded servers: starting them")
        explicit = None
    if explicit is not None:
        database_url, redis_url = explicit
        logger.info(
            "using the configured servers {} and {}",
            redact_url(database_url),
            redact_url(redis_url),
        )
    else:
        try:
            servers = start_embedded(ddir, detached=print_env)
        except EmbeddedError as exc:
            logger.error("could not start the embedded servers: {}", exc)
            return 1
        database_url, redis_url = servers.database_url, servers.redis_url
        if servers.reused and not servers.detached:
            logger.warning(
                "these servers belong to another hivejobs process and stop when it exits"
            )
    if print_env:
        print(export_lines(database_url, redis_url), flush=True)
        return 0
    try:
        with _Signals() as signals:
            if servers is not None:
                print(f"# data in {servers.data_dir}; connect other shells with:")
                print(export_lines(database_url, redis_url), flush=True)
            env = _child_env(database_url, redis_url)
            if app_spec:
                return _run_worker(app_spec, env, signals, reload)
            print("# no MODULE:APP given: servers stay up until Ctrl-C", flush=True)
            return _wait_for_signal(servers, signals)
    finally:
        if servers is not None:
            servers.stop()
