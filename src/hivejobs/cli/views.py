"""Text views the CLI prints for the operator commands: job listings, the chain job log, chain
listings and `chain ps`. Pure formatting of records: no I/O besides returning lines.

What we did not write (names, errors, status text, captured output) goes through
display.escape(), line by line: a handler's output must not drive the operator's terminal.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from hivejobs.display import escape, exception_line
from hivejobs.records.batches import BatchStatus
from hivejobs.records.chains import ChainSummary, JobLogEntry, RunningTry
from hivejobs.records.jobs import JobSummary
from hivejobs.store.sequence import KeyState


def table(rows: Sequence[Sequence[object]]) -> list[str]:
    """Aligned columns, every cell through escape(): the one table of every CLI listing."""
    cells = [[escape(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    return [
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]


def job_rows(jobs: Sequence[JobSummary]) -> list[str]:
    rows: list[tuple[object, ...]] = [
        ("id", "type", "state", "attempt", "prio", "created", "finished", "error")
    ]
    rows += [
        (
            j.id,
            j.name,
            j.state,
            f"{j.attempt}/{j.attempts}",
            j.priority,
            _t(j.created_at),
            _t(j.finished_at),
            (j.error_line or "")[:60],
        )
        for j in jobs
    ]
    return table(rows)


def key_rows(keys: Sequence[KeyState]) -> list[str]:
    """`hivejobs keys`: one line per key; a held key says by which job, since when, why."""
    rows: list[tuple[object, ...]] = [
        ("key", "queued", "scheduled", "running", "next", "held by", "held since", "error")
    ]
    rows += [
        (
            k.key,
            k.queued,
            k.scheduled,
            k.running,
            k.next_id or "",
            k.held_by or "",
            _t(k.held_at),
            exception_line(k.held_error)[:60] if k.held_error else "",
        )
        for k in keys
    ]
    return table(rows)


def chain_rows(chains: Sequence[ChainSummary]) -> list[str]:
    rows: list[tuple[object, ...]] = [
        ("id", "name", "state", "jobs", "succeeded", "created", "finished")
    ]
    rows += [
        (c.id, c.name, c.state, c.jobs, c.succeeded, _t(c.created_at), _t(c.finished_at))
        for c in chains
    ]
    return table(rows)


def ps_rows(tries: Sequence[RunningTry]) -> list[str]:
    rows: list[tuple[object, ...]] = [
        ("chain", "name", "job", "type", "try", "state", "host", "pid", "age", "status")
    ]
    rows += [
        (
            t.chain_id,
            t.chain,
            t.key,
            t.type,
            f"{t.try_}/{t.tries} (total {t.total_tries})",
            t.state or "ended",
            t.host or "-",
            t.pid or "-",
            "-" if t.age_s is None else f"{t.age_s:.1f}s",
            t.status or "",
        )
        for t in tries
    ]
    return table(rows)


def log_lines(entries: Sequence[JobLogEntry]) -> list[str]:
    """spincycle's job log: one block per try, the error's traceback and output indented."""
    lines: list[str] = []
    for e in entries:
        took = "-" if e.duration_s is None else f"{e.duration_s:.3f}s"
        seq = f"  sequence try {e.sequence_try}" if e.sequence_try is not None else ""
        lines.append(
            f"{e.key}  try {e.try_}  {e.type}  {e.state.upper()}  started {_t(e.started_at)}"
            f"  finished {_t(e.finished_at)}  took {took}{seq}  job {escape(e.job_id)}"
        )
        for label, text in (("error", e.error), ("stdout", e.stdout), ("stderr", e.stderr)):
            if text:
                cut = " (cut: the end is kept)" if label != "error" and e.output_truncated else ""
                lines.append(f"  {label}{cut}:")
                lines += ["    " + escape(line) for line in text.rstrip("\n").split("\n")]
    return lines or ["no tries yet"]


def _t(moment: datetime | None) -> str:
    return "-" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def batch_lines(status: BatchStatus) -> list[str]:
    """`hivejobs batch status`: the batch's state and counters, its callbacks, then the
    members that did not succeed (as many as were asked for)."""
    pairs: list[tuple[str, object]] = [
        ("id", status.id),
        ("state", status.state),
        ("total", status.total),
        ("pending", status.pending),
        ("succeeded", status.succeeded),
        ("failed", status.failed),
        ("cancelled", status.cancelled),
        ("expired", status.expired),
        ("on_complete", f"{status.on_complete or '-'} -> {status.complete_job_id or '-'}"),
        ("on_success", f"{status.on_success or '-'} -> {status.success_job_id or '-'}"),
        ("created", _t(status.created_at)),
        ("sealed", _t(status.sealed_at)),
        ("completed", _t(status.completed_at)),
    ]
    lines = [f"{key:<12} {escape(value)}" for key, value in pairs]
    if status.failures:
        lines.append("not succeeded:")
        lines += [f"  {escape(f.job_id)}  {f.state}" for f in status.failures]
    return lines
