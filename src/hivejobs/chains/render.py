"""`hivejobs chain status`: a chain as text, its DAG drawn in layers.

A job's layer is the length of the longest path from a root to it, so every job is printed
below all of its predecessors; each line names the predecessors in another layer above.
Names, status texts and errors come from users and handlers: shown through display.escape.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from graphlib import TopologicalSorter

from hivejobs.display import escape
from hivejobs.records.chains import ChainJobStatus, ChainStatus

_MARK = {
    "pending": " ",
    "queued": ".",
    "scheduled": ".",
    "running": ">",
    "succeeded": "+",
    "failed": "x",
    "stopped": "-",
}


def shown_state(job: ChainJobStatus) -> str:
    """What a chain job is doing now, as `chain ps` says it: a running chain job whose try
    waits for a worker (none started it yet, or a shutdown gave it back) is queued."""
    if job.state == "running" and job.job_state in ("queued", "scheduled"):
        return job.job_state
    return job.state


def layers(jobs: Sequence[ChainJobStatus]) -> list[list[ChainJobStatus]]:
    """The jobs by layer, each layer in the order of `jobs`. The sorter hands out jobs in
    rounds: a job is ready in the round after its last predecessor's, so its round is the
    length of its longest path from a root."""
    sorter = TopologicalSorter({j.key: j.after for j in jobs})
    sorter.prepare()
    layer_of: dict[str, int] = {}
    rounds = 0
    while sorter.is_active():
        ready = sorter.get_ready()
        layer_of.update(dict.fromkeys(ready, rounds))
        sorter.done(*ready)
        rounds += 1
    out: list[list[ChainJobStatus]] = [[] for _ in range(rounds)]
    for job in jobs:
        out[layer_of[job.key]].append(job)
    return out


def render(status: ChainStatus) -> str:
    shown = [shown_state(j) for j in status.jobs]
    waiting = ""
    if status.state == "running" and "running" not in shown:
        queued = sum(s in ("queued", "scheduled") for s in shown)
        waiting = f"  (no try runs now: {queued} waiting for a worker)" if queued else ""
    lines = [
        f"chain {status.id}  {escape(status.name)}  {status.state.upper()}"
        + (
            "  (stop requested)"
            if status.stop_requested and status.state not in ("stopped",)
            else ""
        )
        + waiting,
        f"  created {_t(status.created_at)}  started {_t(status.started_at)}  "
        f"finished {_t(status.finished_at)}  suspensions {status.suspensions}",
    ]
    counts: dict[str, int] = {}
    for state in shown:
        counts[state] = counts.get(state, 0) + 1
    lines.append("  jobs: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    key_w = max(len(escape(j.key)) for j in status.jobs) if status.jobs else 3
    type_w = max(len(escape(j.type)) for j in status.jobs) if status.jobs else 4
    for n, layer in enumerate(layers(status.jobs)):
        lines.append(f"layer {n}")
        for job in sorted(layer, key=lambda j: j.key):
            seq = f" seq {job.sequence}#{job.sequence_try}" if job.sequence else ""
            after = f"  <- {escape(', '.join(job.after))}" if job.after else ""
            text = f'  "{escape(job.status)}"' if job.status else ""
            added = f"  (added by {escape(job.added_by)})" if job.added_by else ""
            error = ""
            if job.state == "failed" and job.error and job.error.strip():
                error = "  error: " + escape(job.error.strip().split("\n")[-1][:120])
            state = shown_state(job)
            lines.append(
                f"  [{_MARK[state]}] {escape(job.key):<{key_w}}  {escape(job.type):<{type_w}}  "
                f"{state:<9}  try {job.try_}/{job.tries} (total {job.total_tries})"
                f"{seq}{after}{added}{text}{error}"
            )
    return "\n".join(lines)


def _t(moment: datetime | None) -> str:
    return "-" if moment is None else moment.astimezone(UTC).strftime("%H:%M:%S")
