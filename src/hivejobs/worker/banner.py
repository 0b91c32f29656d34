"""The worker's start-up banner: what this `hivejobs run` serves, with what, against which
servers. Pure: builds lines and fields; logs.emit_banner prints them. Never shows a password
(every URL goes through redact_url)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version

from hivejobs.config import Settings
from hivejobs.jobtypes import JobType
from hivejobs.urls import redact_url
from hivejobs.worker.placement import footprint, pool_groups


def hivejobs_version() -> str:
    try:
        return version("hivejobs")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def banner(
    job_types: Iterable[JobType],
    app_spec: str,
    settings: Settings,
    coordinator: bool,
    watching: list[str],
) -> tuple[list[str], dict[str, object]]:
    """Lines for a terminal and the same facts as fields for a JSON log."""
    job_types = list(job_types)
    types = sorted(job_types, key=lambda jt: jt.name)
    width = max([len(jt.name) for jt in types] + [4])
    lines = [
        f"hivejobs {hivejobs_version()} · {app_spec} · pid {os.getpid()}",
        f"  postgres     {redact_url(settings.database_url)}",
        f"  redis        {redact_url(settings.redis_url)}",
        f"  prefix       {settings.prefix}",
        f"  coordinator  {'on' if coordinator else 'off (--no-coordinator)'}",
    ]
    if watching:
        lines.append(f"  reload       on code change in {', '.join(watching)}")
    groups = pool_groups(job_types)
    size = footprint(groups, coordinator)
    pools = sum(g.processes for g in groups)
    lines.append(f"  job types    {len(types)}, pool processes {pools}")
    for jt in types:
        timeout = f", timeout {jt.timeout_s:g} s" if jt.timeout_s is not None else ""
        procs = f" x {jt.processes} processes" if jt.processes > 1 else ""
        pool = f", pool {jt.pool}" if jt.pool is not None else ""
        lines.append(
            f"    {jt.name:<{width}}  concurrency {jt.concurrency}{procs}, {jt.delivery},"
            f" attempts {jt.attempts}{timeout}{pool}"
        )
    lines.append(
        f"  footprint    {size.processes} processes, at most {size.postgres_connections_max}"
        f" Postgres connections = {size.formula}"
    )
    fields: dict[str, object] = {
        "version": hivejobs_version(),
        "app": app_spec,
        "database_url": redact_url(settings.database_url),
        "redis_url": redact_url(settings.redis_url),
        "prefix": settings.prefix,
        "coordinator": coordinator,
        "reload": watching,
        "processes": size.processes,
        "postgres_connections_max": size.postgres_connections_max,
        "job_types": {
            jt.name: {
                "concurrency": jt.concurrency,
                "processes": jt.processes,
                "delivery": jt.delivery,
                "attempts": jt.attempts,
                "timeout_s": jt.timeout_s,
                "pool": jt.pool,
            }
            for jt in types
        },
    }
    return lines, fields
