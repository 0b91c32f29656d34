"""`hivejobs run --reload`: a watcher child that exits with ChildExit.RELOAD when the app's code
changes; the supervisor then stops its pools gracefully and re-execs itself (the same path
as `hivejobs restart`). Only Python files count. Never touches a job."""

from __future__ import annotations

import importlib.util
import os
import sys

from loguru import logger

from hivejobs.worker.exits import ChildExit

DEBOUNCE_MS = 300  # an editor's save is several writes: wait for them to settle


def app_source_dirs(app_spec: str) -> list[str]:
    """The folder of the app's top-level package (or of its module): the code to watch."""
    top = app_spec.partition(":")[0].split(".")[0]
    module = sys.modules.get(top)
    paths = list(getattr(module, "__path__", []) or [])
    if not paths:
        spec = importlib.util.find_spec(top)
        origin = spec.origin if spec is not None else None
        paths = [os.path.dirname(origin)] if origin else [os.getcwd()]
    return [os.path.abspath(p) for p in paths]


def check_watch_available() -> str | None:
    """None when watchfiles is importable, else what to install."""
    if importlib.util.find_spec("watchfiles") is None:
        return "--reload needs watchfiles: pip install 'hivejobs[reload]'"
    return None


def watch_for_changes(paths: list[str]) -> int:
    from watchfiles import PythonFilter, watch

    for changes in watch(*paths, watch_filter=PythonFilter(), debounce=DEBOUNCE_MS):
        changed = sorted({os.path.relpath(path) for _, path in changes})
        logger.info("code changed: reloading", files=changed[:5])
        return ChildExit.RELOAD
    return 0
