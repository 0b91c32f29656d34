"""hivejobs driver: runs with the project's own interpreter (``pip install -e .``).

It writes a tiny app module to a temp dir (the CLI needs an importable ``MODULE:APP``), then
starts ONE ``hivejobs run peers_hivejobs_app:app --shutdown-timeout 5`` supervisor, which
forks the job type's pool processes (``processes=2``, ``concurrency=8`` each). Every job is
stored in Postgres; Redis is the broker. The handler is a ``def`` (PEERS_BODY=sync, the
blocking body) or an ``async def`` (PEERS_BODY=async, the asyncio body), both written as a
user of each kind would.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import _common

APP_MODULE = "peers_hivejobs_app"
# WARNING, as the pgqueuer, rq and huey drivers run theirs: no line per job. Our default
# INFO (one line per job, ~25-30 us of a pool's CPU) with HIVEJOBS_LOG_LEVEL=INFO.
LOG_LEVEL = os.environ.get("HIVEJOBS_LOG_LEVEL", "WARNING")
APP_SOURCE = '''\
"""Benchmark app written by bench/peers/drivers/hivejobs_driver.py (temporary)."""
import os

import _common
from hivejobs import App, JobContext

app = App(
    database_url=os.environ[_common.PG_URL_ENV],
    redis_url=os.environ[_common.REDIS_URL_ENV],
    prefix="hivejobs:",
)


if os.environ[_common.BODY_ENV] == "async":

    @app.job("noop", concurrency=8, processes=2)
    async def noop(ctx: JobContext, payload: dict) -> None:
        await _common.ajob(float(payload.get("t", 0.0)))

else:

    @app.job("noop", concurrency=8, processes=2)
    def noop(ctx: JobContext, payload: dict) -> None:
        _common.job(float(payload.get("t", 0.0)))
'''
HANDLER = {"sync": "`def` handler", "async": "`async def` handler"}


def cli_command() -> list[str]:
    """The ``hivejobs`` console script of this interpreter, else the entry point via -c."""
    exe = Path(sys.executable).parent / "hivejobs"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("hivejobs")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from hivejobs.cli import main; sys.exit(main())"]


def main() -> None:
    args = _common.parse_args(needs_pg=True)
    body = _common.chosen_body(("sync", "async"))
    _common.install_sigterm()
    try:
        import hivejobs  # noqa: F401
    except Exception as exc:  # not importable yet: say so, run.py shows "unavailable"
        _common.emit({"system": "hivejobs", "unavailable": f"{type(exc).__name__}: {exc}"})
        return
    try:
        hv = version("hivejobs")
    except PackageNotFoundError:
        hv = "dev"

    with tempfile.TemporaryDirectory(prefix="peers-hivejobs-") as tmp:
        Path(tmp, f"{APP_MODULE}.py").write_text(APP_SOURCE)
        sys.path.insert(0, tmp)
        app = importlib.import_module(APP_MODULE).app
        app.migrate()

        def start_workers(w: _common.Workers) -> None:
            cmd = cli_command() + [
                "run",
                f"{APP_MODULE}:app",
                "--shutdown-timeout",
                "5",
                "--log-level",
                LOG_LEVEL,
            ]
            # The caller's PYTHONPATH stays (a worktree's src/ must win over an installed copy).
            path = os.pathsep.join(p for p in (tmp, os.environ.get("PYTHONPATH", "")) if p)
            w.start(cmd, env={"PYTHONPATH": path})

        result = _common.run_workload(
            args,
            system="hivejobs",
            version=hv,
            keeps_jobs_in="Postgres (+ Redis broker)",
            enqueue_one=lambda t: app.enqueue("noop", {"t": t}),
            enqueue_bulk=lambda ts: app.enqueue_many("noop", [{"t": t} for t in ts]),
            start_workers=start_workers,
            settings=f"{HANDLER[body]}, `hivejobs run --log-level {LOG_LEVEL}`, "
            "processes=2 x concurrency=8",
        )
        close = getattr(app, "close", None)
        if callable(close):
            close()
    _common.emit(result)


if __name__ == "__main__":
    main()
