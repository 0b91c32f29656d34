"""The app that process and fault tests run with `hivejobs run tests.apps.faultapp:app`.

Handlers write a ledger line per event to $HJ_LEDGER/ledger.<pid> (O_APPEND, one write per
line, so lines survive kill -9 and never interleave). HJ_TYPES selects the job types to
register (default: all), HJ_CONCURRENCY_<TYPE> overrides a type's concurrency.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from hivejobs import App, Backoff, Interrupted, JobContext, Retry
from tests.apps.gate import wait_at_gate
from tests.apps.ledger import note

app = App()
SELECTED = set(filter(None, os.environ.get("HJ_TYPES", "").split(",")))
F = TypeVar("F", bound=Callable[..., Any])


def start(ctx: JobContext) -> None:
    note("start", ctx.job_id, ctx.attempt, os.getpid(), time.monotonic_ns(), threading.get_ident())


def end(ctx: JobContext, outcome: str) -> None:
    note("end", ctx.job_id, ctx.attempt, outcome, os.getpid())


def register(name: str, **options: Any) -> Callable[[F], F]:
    def wrap(fn: F) -> F:
        if SELECTED and name not in SELECTED:
            return fn
        key = "HJ_CONCURRENCY_" + name.upper()
        if key in os.environ:
            options["concurrency"] = int(os.environ[key])
        return app.job(name, **options)(fn)

    return wrap


def work(payload: dict[str, float | str]) -> None:
    """Wait at the test's gate `gate` if the payload names one, else sleep `ms`."""
    if "gate" in payload:
        wait_at_gate(str(payload["gate"]))
    else:
        time.sleep(float(payload.get("ms", 10)) / 1000)


@register("alo", concurrency=8, attempts=5)
def alo(ctx: JobContext, payload: dict[str, float | str]) -> None:
    start(ctx)
    work(payload)
    end(ctx, "ok")


@register("amo", concurrency=4, delivery="at_most_once")
def amo(ctx: JobContext, payload: dict[str, float | str]) -> None:
    start(ctx)
    work(payload)
    end(ctx, "ok")


@register("long_coop", concurrency=6, attempts=3)
def long_coop(ctx: JobContext, payload: dict[str, float | str]) -> None:
    """Long work (`s` seconds, or until gate `gate` opens) that checks ctx.stopping every
    100 ms and stops cooperatively."""
    start(ctx)
    if "gate" in payload:
        if not wait_at_gate(str(payload["gate"]), ctx.stopping):
            end(ctx, "interrupted")
            raise Interrupted()
        end(ctx, "ok")
        return
    deadline = time.monotonic() + float(payload.get("s", 20))
    while time.monotonic() < deadline:
        if ctx.stopping.wait(0.1):
            end(ctx, "interrupted")
            raise Interrupted()
    end(ctx, "ok")


def deaf_work(payload: dict[str, float | str]) -> None:
    """Wait at gate `gate` if the payload names one, else sleep `s` (default 20) seconds;
    either way deaf to ctx.stopping."""
    if "gate" in payload:
        wait_at_gate(str(payload["gate"]))
    else:
        time.sleep(float(payload.get("s", 20)))


@register("long_stubborn", concurrency=2, attempts=3)
def long_stubborn(ctx: JobContext, payload: dict[str, float | str]) -> None:
    """Long work that ignores ctx.stopping."""
    start(ctx)
    deaf_work(payload)
    end(ctx, "ok")


@register("long_amo", concurrency=2, delivery="at_most_once")
def long_amo(ctx: JobContext, payload: dict[str, float | str]) -> None:
    start(ctx)
    deaf_work(payload)
    end(ctx, "ok")


@register("hang", concurrency=2, attempts=1, timeout=1.0)
def hang(ctx: JobContext, payload: dict[str, float]) -> None:
    """Never returns and ignores ctx.stopping."""
    start(ctx)
    threading.Event().wait()


@register("exit", concurrency=2, delivery="at_most_once")
def exit_job(ctx: JobContext, payload: dict[str, float]) -> None:
    start(ctx)
    os._exit(1)


@register("raises", concurrency=2, attempts=3, backoff=Backoff(base_s=0.1))
def raises(ctx: JobContext, payload: dict[str, float]) -> None:
    start(ctx)
    end(ctx, "error")
    raise ValueError("always fails")


def _poison(ctx: JobContext, payload: dict[str, str]) -> str:
    """Behaviour chosen by the payload: ok, raise, exit (kills the process), hang."""
    start(ctx)
    action = payload.get("do", "ok")
    if action == "raise":
        end(ctx, "error")
        raise ValueError("poison raised")
    if action == "exit":
        os._exit(1)
    if action == "hang":
        threading.Event().wait()
    time.sleep(0.01)
    end(ctx, "ok")
    return action


register("poison", concurrency=4, attempts=3, timeout=1.0, backoff=Backoff(base_s=0.1))(_poison)
register("poison_amo", concurrency=2, delivery="at_most_once", timeout=1.0)(_poison)


# -- opt-in types (registered only when HJ_TYPES names them) ------------------------------


def unchanged(fn: F) -> F:
    return fn


def opt_in(name: str, **options: Any) -> Callable[[F], F]:
    """Like register(), but never part of "all types": only an explicit HJ_TYPES adds it."""
    if name in SELECTED:
        return register(name, **options)
    return unchanged


def _allocate_until_refused() -> None:
    """Lower RLIMIT_AS to 512 MiB (or 256 MiB above what the process maps already), allocate
    until MemoryError, then restore it: the MemoryError fails the attempt like any error."""
    import resource

    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (max(512 << 20, mapped + (256 << 20)), hard))
    hoard = []
    try:
        while True:
            hoard.append(bytes(32 << 20))  # calloc: address space, no page touched
    finally:
        hoard.clear()
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _hog_the_gil(seconds: float) -> None:
    """Catastrophic regex backtracking: the re engine never releases the GIL (~2 s a call)."""
    import re

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        re.match(r"(a+)+$", "a" * 25 + "b")


def _poison_plan(ctx: JobContext, payload: dict[str, Any]) -> str:
    """RELIABILITY S8: normal work, or the poison the payload names."""
    start(ctx)
    action = payload.get("do", "ok")
    if action == "raise":
        end(ctx, "error")
        raise ValueError("poison raised")
    if action == "segfault":
        import ctypes

        ctypes.string_at(0)
    if action == "exit":
        os._exit(1)
    if action == "oom":
        _allocate_until_refused()
    if action == "hang":
        threading.Event().wait()
    if action == "gil_hog":
        _hog_the_gil(float(payload.get("s", 20)))
    time.sleep(float(payload.get("ms", 10)) / 1000)
    end(ctx, "ok")
    return str(action)


_S8 = {"concurrency": 4, "backoff": Backoff(base_s=0.1)}
opt_in("s8_raise", attempts=3, **_S8)(_poison_plan)
opt_in("s8_segfault", attempts=3, **_S8)(_poison_plan)
opt_in("s8_exit", delivery="at_most_once", **_S8)(_poison_plan)
opt_in("s8_oom", attempts=3, **_S8)(_poison_plan)
opt_in("s8_hang", attempts=1, timeout=2.0, **_S8)(_poison_plan)
opt_in("s8_gil_hog", delivery="at_most_once", timeout=2.0, **_S8)(_poison_plan)


# -- keyed types (fair and sequenced jobs mixed into chaos S1, S3, S4) -----------------------


@opt_in("alo_fair", concurrency=8, attempts=5, fair_by="k")
def alo_fair(ctx: JobContext, payload: dict[str, float | str]) -> None:
    """`alo` handed out round-robin across the payload's key `k`."""
    start(ctx)
    work(payload)
    end(ctx, "ok")


@opt_in("alo_seq", concurrency=8, attempts=5, sequence_by="k")
def alo_seq(ctx: JobContext, payload: dict[str, float | str]) -> None:
    """`alo` one at a time per key `k`, in enqueue order (`i`: the job's place in its key's
    line). Beside `alo`'s lines it writes bench/sequence_check.py's run record, tagged
    seq_begin / seq_end ("end" is `alo`'s): "seq_begin <id> <pid> <ns> <k> <i>"."""
    start(ctx)
    pid = os.getpid()
    note("seq_begin", ctx.job_id, pid, time.monotonic_ns(), payload["k"], int(payload["i"]))
    work(payload)
    note("seq_end", ctx.job_id, pid, time.monotonic_ns())
    end(ctx, "ok")


# -- async twins (RELIABILITY S1, S3, S8, S13 run them beside the def types) ----------------


async def work_async(payload: dict[str, float | str]) -> None:
    """work() for an `async def` handler: the gate waited for off the loop, else `ms` of
    asyncio.sleep (the loop runs the pool's other tasks meanwhile)."""
    if "gate" in payload:
        await asyncio.to_thread(wait_at_gate, str(payload["gate"]))
    else:
        await asyncio.sleep(float(payload.get("ms", 10)) / 1000)


@opt_in("alo_async", concurrency=8, attempts=5)
async def alo_async(ctx: JobContext, payload: dict[str, float | str]) -> None:
    start(ctx)
    await work_async(payload)
    end(ctx, "ok")


@opt_in("amo_async", concurrency=4, delivery="at_most_once")
async def amo_async(ctx: JobContext, payload: dict[str, float | str]) -> None:
    start(ctx)
    await work_async(payload)
    end(ctx, "ok")


@opt_in("long_coop_async", concurrency=6, attempts=3)
async def long_coop_async(ctx: JobContext, payload: dict[str, float | str]) -> None:
    """Long work (`s` seconds) that a shutdown stops as the cancellation of its task."""
    start(ctx)
    try:
        await asyncio.sleep(float(payload.get("s", 20)))
    except asyncio.CancelledError:
        end(ctx, "interrupted")
        raise
    end(ctx, "ok")


async def _poison_plan_async(ctx: JobContext, payload: dict[str, Any]) -> str:
    """RELIABILITY S8 for `async def` handlers: normal work, or the poison the payload names
    (a hang awaits forever: its timeout cancels the task)."""
    start(ctx)
    action = payload.get("do", "ok")
    if action == "raise":
        end(ctx, "error")
        raise ValueError("poison raised")
    if action == "exit":
        os._exit(1)
    if action == "hang":
        await asyncio.Event().wait()
    await asyncio.sleep(float(payload.get("ms", 10)) / 1000)
    end(ctx, "ok")
    return str(action)


opt_in("s8_async_raise", attempts=3, **_S8)(_poison_plan_async)
opt_in("s8_async_exit", delivery="at_most_once", **_S8)(_poison_plan_async)
opt_in("s8_async_hang", attempts=1, timeout=2.0, **_S8)(_poison_plan_async)


class Shape(msgspec.Struct, forbid_unknown_fields=True):
    """A typed payload (RELIABILITY S9: schema violations and schema drift)."""

    width: int
    height: int


@opt_in("typed", concurrency=2, attempts=3)
def typed(ctx: JobContext, payload: Shape) -> int:
    start(ctx)
    end(ctx, "ok")
    return payload.width * payload.height


@opt_in("retry_once", concurrency=4, attempts=3)
def retry_once(ctx: JobContext, payload: dict[str, float]) -> None:
    """RELIABILITY S10: asks for a retry `delay` s later on its first attempt."""
    start(ctx)
    if ctx.attempt == 1:
        end(ctx, "retry")
        raise Retry(delay=payload.get("delay", 2.0))
    end(ctx, "ok")


def _noop(ctx: JobContext, payload: dict[str, float]) -> None:
    start(ctx)
    end(ctx, "ok")


for _i in range(4):  # RELIABILITY S11: four no-op types for the backlog
    opt_in(f"noop{_i}", concurrency=8)(_noop)


if os.environ.get("HJ_CRON") and (not SELECTED or "alo" in SELECTED):
    # A periodic schedule for the cron tests: one `alo` job per tick; the ticks missed while
    # no coordinator led are caught up unless HJ_CRON_CATCH_UP=0.
    catch_up = os.environ.get("HJ_CRON_CATCH_UP", "1") == "1"
    app.periodic("alo", os.environ["HJ_CRON"], {"ms": 1}, name="tick", catch_up=catch_up)
