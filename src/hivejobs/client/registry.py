"""The App's registry calls: `@app.job`, `app.periodic`, `@app.on_process_start`.

Filled while the app module is imported, read-only afterwards. Every option is checked when
`app.job(...)` is called (a bad declaration fails at import, not in a worker); the decorated
function makes the type complete, built once (`JobType.with_handler`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import get_args

from hivejobs.broker.fair import checked_fair
from hivejobs.config import Settings
from hivejobs.debounce import Debounce, Unique, checked_key, debounce_policy
from hivejobs.errors import InvalidJobType, UnknownJobType
from hivejobs.flow import checked_limits
from hivejobs.jobtypes import (
    MAX_DELAY_S,
    NAME_RE,
    UNIQUE_STATES,
    Backoff,
    F,
    JobType,
    JobTypeSpec,
    check_priority,
)
from hivejobs.jobtypes import Unique as UniqueWindow
from hivejobs.records.fleet import Schedule
from hivejobs.records.jobs import Delivery, JobState
from hivejobs.schedules import check_cron
from hivejobs.sequence import checked_sequence
from hivejobs.serialization import PayloadCodec
from hivejobs.worker.memory import checked_max_rss
from hivejobs.worker.placement import check_pool


class Registry:
    """The job types (`types`), schedules and process-start hooks of an App."""

    settings: Settings
    types: dict[str, JobType]
    schedules: dict[str, Schedule]
    process_start_hooks: list[Callable[[], object]]  # on_process_start, in order

    def job(
        self,
        name: str,
        *,
        concurrency: int = 8,
        processes: int = 1,
        attempts: int | None = None,
        delivery: Delivery = "at_least_once",
        timeout: float | None = None,
        backoff: Backoff | None = None,
        priority: int = 0,
        cron: str | None = None,
        tz: str = "UTC",
        catch_up: bool = False,
        unique_for: float | None = None,
        unique_by: Sequence[str] | None = None,
        unique_states: Sequence[str] = UNIQUE_STATES,
        on_duplicate: str = "return",
        unique: Unique | None = None,
        callback: bool = False,
        callback_timeout: float = 3600.0,
        retention: float | None = None,
        global_concurrency: int | None = None,
        rate: str | None = None,
        burst: int | None = None,
        limit_by: str | None = None,
        max_rss_mb: float | None = None,
        pool: str | None = None,
        fair_by: str | None = None,
        fair_weights: Mapping[str | int, int] | None = None,
        sequence_by: str | None = None,
        on_failure: str | None = None,
    ) -> Callable[[F], F]:
        """Register a handler `fn(ctx, payload)` as job type `name`.

        `cron` also runs it periodically with a `None` payload (see `periodic`).
        `unique_for` seconds: a job whose payload (or its `unique_by` fields) matches a job
        of this type enqueued within that window and still in one of `unique_states` is not
        stored again; `enqueue` returns the existing id (or raises JobDuplicate with
        `on_duplicate="raise"`). Enforced by a Postgres primary key, so racing enqueuers on
        many machines store one job.

        `unique=Unique(key=[...], within=s, mode=...)`: the same window (mode="window"), or
        mode="debounce" (the key's last enqueue runs, after `within` s of quiet, at most
        `max_wait` s after the first) or mode="coalesce" (later enqueues are merged into the
        waiting job by `merge`); hivejobs/debounce.py defines them.

        `callback=True`: the handler starts work elsewhere and returns; the job stays running
        until the other service reports the attempt's outcome (`complete_callback`, or POST
        /v1/jobs/{name}/{id}), or `callback_timeout` seconds pass (then it is retried like a
        failed attempt while attempts are left, else failed).

        `retention`: seconds its finished jobs stay in the archive (default: the
        `archive_retention_s` setting), e.g. a day for chatty jobs, a year for payments.

        Fleet-wide limits, across every instance (flow.py): `global_concurrency` jobs of this
        type running at once; `rate="100/s"` (or "/m", "/h") starts, from a token bucket of
        `burst` starts (default one second's worth). A job over a limit waits queued.
        `limit_by="customer_id"` makes `global_concurrency` and `rate` bounds per value of
        that payload field (at most N running, and its own token bucket, per customer); its
        payloads must be JSON objects holding the field (PayloadInvalid at enqueue
        otherwise).

        `max_rss_mb`: a pool process whose resident memory passes it finishes its running
        jobs and is forked again (a suspension of what still runs, not a failure).

        `pool="small"`: run in one process with the other types of that pool
        (worker/placement.py), each
        keeping its own concurrency, delivery, timeout, limits and retries; they share the
        process's connections, memory cap and restarts, so `processes` and `max_rss_mb`
        must be the same for every type of a pool. None: a process of its own.

        `fair_by="customer_id"`: jobs are handed out round-robin across the values of that
        payload field (broker/fair.py), so one key's backlog never starves another's;
        `fair_weights={"big": 4}` gives a key that many jobs per turn (others: 1). Payloads
        must be JSON objects holding the field as a string or integer (PayloadInvalid at
        enqueue otherwise). docs/howto/fair-dispatch.md says where the guarantee ends.

        `sequence_by="account_id"`: at most one job per value of that payload field runs at a
        time, in enqueue order, fleet-wide (sequence.py, docs/howto/sequences.md); payloads
        must hold the field (PayloadInvalid at enqueue otherwise). A failed attempt with
        attempts left holds the key until its retry; a job failed for good holds it until
        it is replayed or the key released (`on_failure="hold"`, the default), or lets the
        key go on (`on_failure="continue"`)."""
        max_bytes = self.settings.max_payload_bytes
        core = declare_type(
            self.types,
            name,
            concurrency,
            processes,
            attempts,
            delivery,
            timeout,
            priority,
            max_bytes,
        )
        limits = checked_limits(global_concurrency, rate, burst, limit_by)
        sequence = checked_sequence(sequence_by, on_failure, cron)
        rss = checked_max_rss(max_rss_mb)
        check_pool(self.types, name, pool, processes, rss)
        fair = checked_fair(fair_by, fair_weights)
        if cron is not None:
            check_cron(cron, tz)
        window = None
        if unique_for is not None:
            window = checked_unique(unique_for, unique_by, unique_states, on_duplicate)
        debounce = None
        if unique is not None:
            window, debounce = unique_policies(unique, window, unique_states, on_duplicate)
        spec = dataclasses.replace(
            core,
            limits=limits,
            sequence=sequence,
            max_rss_mb=rss,
            pool=pool,
            fair=fair,
            unique=window,
            debounce=debounce,
            callback=bool(callback),
            callback_timeout_s=check_callback_timeout(callback_timeout) if callback else None,
            retention_s=check_retention(retention),
        )

        def register(fn: F) -> F:
            self.types[name] = JobType.with_handler(spec, fn, backoff or Backoff(), max_bytes)
            if cron is not None:
                self.periodic(name, cron, tz=tz, catch_up=catch_up)
            return fn

        return register

    def periodic(
        self,
        job_type: str,
        cron: str,
        payload: object = None,
        *,
        name: str | None = None,
        tz: str = "UTC",
        catch_up: bool = False,
        priority: int | None = None,
    ) -> None:
        """Enqueue a job of `job_type` at every tick of `cron` (5 fields, or 6 with seconds
        last), read in time zone `tz`. The active coordinator enqueues exactly one job per
        tick across the fleet. Ticks missed while no coordinator ran are skipped, or all
        enqueued with `catch_up=True`. `name` (default: the job type) identifies the
        schedule; declare several per type under different names."""
        schedule = new_schedule(
            self.types, self.schedules, job_type, cron, payload, name, tz, catch_up, priority
        )
        self.schedules[schedule.name] = schedule

    def on_process_start(self, fn: Callable[[], object]) -> Callable[[], object]:
        """Decorator: `fn()` runs in each process `hivejobs run` forks (pools, coordinator),
        first thing after the fork, before it takes any work. What must not cross a fork
        goes here: e.g. an OpenTelemetry exporter's connections and threads
        (docs/howto/opentelemetry.md). An exception in it crashes that process (restarted
        with backoff), so a broken setup is loud."""
        self.process_start_hooks.append(fn)
        return fn


# -- the checks of a declaration --------------------------------------------------------------


def declare_type(
    registered: Mapping[str, JobType],
    name: str,
    concurrency: int,
    processes: int,
    attempts: int | None,
    delivery: str,
    timeout: float | None,
    priority: int,
    max_payload_bytes: int,
) -> JobTypeSpec:
    """The checked core of a new job type (its other options are checked by the App, its
    handler comes with `JobType.with_handler`); `registered` has its peers."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise InvalidJobType(f"job type name {name!r} must be 1-64 letters, digits, _.-")
    if name in registered:
        raise InvalidJobType(f"job type {name!r} is registered twice")
    if delivery not in ("at_least_once", "at_most_once"):
        raise InvalidJobType(
            f"delivery must be 'at_least_once' or 'at_most_once', not {delivery!r}"
        )
    if delivery == "at_most_once" and attempts not in (None, 1):
        raise InvalidJobType(
            f"job type {name!r} is at_most_once, so it runs at most one attempt: "
            f"attempts={attempts} is impossible (drop it or use at_least_once)"
        )
    resolved = attempts if attempts is not None else (1 if delivery == "at_most_once" else 5)
    if resolved < 1:
        raise InvalidJobType(f"attempts must be at least 1, not {resolved}")
    if concurrency < 1 or processes < 1:
        raise InvalidJobType("concurrency and processes must be at least 1")
    if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
        raise InvalidJobType(f"timeout must be a positive number of seconds, not {timeout}")
    check_priority(priority)
    return JobTypeSpec(
        name=name,
        concurrency=concurrency,
        processes=processes,
        attempts=resolved,
        delivery="at_most_once" if delivery == "at_most_once" else "at_least_once",
        timeout_s=timeout,
        priority=priority,
        codec=PayloadCodec(name, None, max_payload_bytes),
    )


def check_callback_timeout(callback_timeout: float) -> float:
    if not (callback_timeout > 0 and math.isfinite(callback_timeout)):
        raise InvalidJobType(
            f"callback_timeout must be a positive number of seconds, not {callback_timeout}"
        )
    return float(callback_timeout)


def check_retention(retention: float | None) -> float | None:
    if retention is not None and not (
        isinstance(retention, int | float) and 0 < retention < math.inf
    ):
        raise InvalidJobType(f"retention must be a positive number of seconds, not {retention}")
    return None if retention is None else float(retention)


def checked_unique(
    window_s: float, by: Sequence[str] | None, states: Sequence[str], on_duplicate: str
) -> UniqueWindow:
    if isinstance(window_s, bool) or not isinstance(window_s, int | float):
        raise InvalidJobType(f"unique_for must be seconds, not {type(window_s).__name__}")
    if not (0 < window_s <= MAX_DELAY_S):  # also refuses NaN
        raise InvalidJobType(
            f"unique_for must be between 0 and {MAX_DELAY_S:.0f} s, not {window_s}"
        )
    unknown = [st for st in states if st not in get_args(JobState)]
    if unknown or not states or isinstance(states, str):
        raise InvalidJobType(f"unique_states must be job states from {get_args(JobState)}")
    if by is not None and (isinstance(by, str) or not all(isinstance(f, str) for f in by)):
        raise InvalidJobType("unique_by must be a list of payload field names")
    if on_duplicate not in ("return", "raise"):
        raise InvalidJobType(f"on_duplicate must be 'return' or 'raise', not {on_duplicate!r}")
    return UniqueWindow(
        float(window_s), None if by is None else tuple(by), tuple(states), on_duplicate
    )


def unique_policies(
    spec: Unique,
    window: UniqueWindow | None,
    states: Sequence[str],
    on_duplicate: str,
) -> tuple[UniqueWindow | None, Debounce | None]:
    """`unique=UniqueWindow(...)`: a window (as `unique_for`) or a debounce/coalesce policy."""
    if window is not None:
        raise InvalidJobType("unique: give either unique=UniqueWindow(...) or unique_for, not both")
    policy = debounce_policy(spec)
    if policy is not None:
        return None, policy
    by = checked_key(spec.key)
    return checked_unique(spec.within, by, states, on_duplicate), None


def new_schedule(
    types: Mapping[str, JobType],
    schedules: Mapping[str, Schedule],
    job_type: str,
    cron: str,
    payload: object,
    name: str | None,
    tz: str,
    catch_up: bool,
    priority: int | None,
) -> Schedule:
    """A checked periodic schedule of a registered type; `schedules` has its peers."""
    jt = types.get(job_type)
    if jt is None:
        raise UnknownJobType(job_type, sorted(types))
    key = job_type if name is None else name
    if not NAME_RE.fullmatch(key):
        raise InvalidJobType(f"schedule name {key!r} must be 1-64 letters, digits, _.-")
    if key in schedules:
        raise InvalidJobType(f"schedule {key!r} is declared twice")
    check_cron(cron, tz)
    prio = jt.priority if priority is None else priority
    check_priority(prio)
    return Schedule(
        name=key,
        job_type=job_type,
        cron=cron,
        tz=tz,
        payload=jt.encode(payload),
        priority=prio,
        catch_up=catch_up,
    )
