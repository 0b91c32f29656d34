"""`hivejobs chain status`: a chain as text, its DAG drawn in layers.

A job's layer is the length of the longest path from a root to it, so every job is printed
below all of its predecessors; each line names the predecessors in another layer above.
Names, status texts and errors come from users and handlers: shown through display.escape.
"""

from __future__ import annotations

from datetime import UTC, datetime

from hivejobs.display import escape
from hivejobs.records import ChainJobStatus, ChainStatus

_MARK = {"pending": " ", "running": ">", "succeeded": "+", "failed": "x", "stopped": "-"}


def layers(jobs: list[ChainJobStatus]) -> list[list[ChainJobStatus]]:
    by_key = {j.key: j for j in jobs}
    depth: dict[str, int] = {}

    def depth_of(key: str) -> int:
        # Iterative: a 100,000-job line must not hit the recursion limit.
        stack = [key]
        while stack:
            top = stack[-1]
            missing = [d for d in by_key[top].after if d not in depth]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            depth[top] = 1 + max((depth[d] for d in by_key[top].after), default=-1)
        return depth[key]

    out: list[list[ChainJobStatus]] = []
    for job in jobs:
        d = depth_of(job.key)
        while len(out) <= d:
            out.append([])
        out[d].append(job)
    return out


def render(status: ChainStatus) -> str:
    lines = [
        f"chain {status.id}  {escape(status.name)}  {status.state.upper()}"
        + (
            "  (stop requested)"
            if status.stop_requested and status.state not in ("stopped",)
            else ""
        ),
        f"  created {_t(status.created_at)}  started {_t(status.started_at)}  "
        f"finished {_t(status.finished_at)}  suspensions {status.suspensions}",
    ]
    counts: dict[str, int] = {}
    for job in status.jobs:
        counts[job.state] = counts.get(job.state, 0) + 1
    lines.append("  jobs: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    key_w = max(len(escape(j.key)) for j in status.jobs) if status.jobs else 3
    type_w = max(len(escape(j.type)) for j in status.jobs) if status.jobs else 4
    for n, layer in enumerate(layers(status.jobs)):
        lines.append(f"layer {n}")
        for job in sorted(layer, key=lambda j: j.key):
            seq = f" seq {job.sequence}#{job.sequence_try}" if job.sequence else ""
            after = f"  <- {escape(', '.join(job.after))}" if job.after else ""
            text = f'  "{escape(job.status)}"' if job.status else ""
            error = ""
            if job.state == "failed" and job.error and job.error.strip():
                error = "  error: " + escape(job.error.strip().split("\n")[-1][:120])
            lines.append(
                f"  [{_MARK[job.state]}] {escape(job.key):<{key_w}}  {escape(job.type):<{type_w}}  "
                f"{job.state:<9}  try {job.try_}/{job.tries} (total {job.total_tries})"
                f"{seq}{after}{text}{error}"
            )
    return "\n".join(lines)


def _t(moment: datetime | None) -> str:
    return "-" if moment is None else moment.astimezone(UTC).strftime("%H:%M:%S")
