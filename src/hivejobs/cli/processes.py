"""Commands that set hivejobs up or start its long-running processes: `migrate`, `run` (the
worker supervisor), `serve` (HTTP API and dashboard), `dev` (embedded servers) and `bench`.

`run`, `serve`, `dev` and `bench` hand over to their package (worker/, web/, dev/, bench/),
imported only when the command runs: `hivejobs status` does not load the web stack.
"""

from __future__ import annotations

import argparse
import os

from hivejobs.cli.shared import ExitCode, open_app
from hivejobs.client.app import load_app
from hivejobs.config import positive_seconds
from hivejobs.errors import ConfigError, UsageError
from hivejobs.urls import redact_url
from hivejobs.worker.reload import app_source_dirs, check_watch_available


def cmd_migrate(args: argparse.Namespace) -> int:
    app = open_app(args)
    applied = app.migrate()
    url = redact_url(app.settings.database_url)
    print(f"applied {', '.join(applied)} to {url}" if applied else f"schema up to date at {url}")
    return ExitCode.OK


def cmd_run(args: argparse.Namespace) -> int:
    from hivejobs.worker.supervisor import Supervisor

    # Checked before the app is imported: a NaN here would SIGKILL every pool on SIGTERM.
    timeout = args.shutdown_timeout
    if timeout is not None:
        timeout = positive_seconds("--shutdown-timeout", timeout)
    # Through the environment: every child sets its own sink up after fork from it.
    if args.log_level:
        os.environ["HIVEJOBS_LOG_LEVEL"] = args.log_level
    if args.log_format:
        os.environ["HIVEJOBS_LOG_FORMAT"] = args.log_format
    if args.reload and (missing := check_watch_available()):
        raise ConfigError(missing)
    app = load_app(args.app_spec)
    if app.testing is not None:
        raise UsageError(
            f"{args.app_spec} was made with App(testing={app.testing!r}): its jobs run in the"
            " caller at enqueue, so a worker would serve nothing; give `hivejobs run` an App"
            " made without testing="
        )
    if timeout is not None:
        app.settings.shutdown_timeout_s = timeout
    metrics = (args.metrics_host, args.metrics_port) if args.metrics_port is not None else None
    watch = app_source_dirs(args.app_spec) if args.reload else None
    return Supervisor(
        app,
        args.app_spec,
        app.settings,
        coordinator=not args.no_coordinator,
        metrics=metrics,
        watch=watch,
    ).run()


def cmd_serve(args: argparse.Namespace) -> int:
    from hivejobs.web.serve import serve_main

    return serve_main(args)


def cmd_dev(args: argparse.Namespace) -> int:
    from hivejobs.dev.command import dev_main

    return dev_main(
        args.app_spec, args.data_dir, args.print_env, stop=args.stop, reload=args.reload
    )


def cmd_bench(args: argparse.Namespace) -> int:
    from hivejobs.bench import run_bench

    return run_bench(args)
