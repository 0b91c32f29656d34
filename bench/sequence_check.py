"""The sequence checker, shared by tests/process/test_sequence_run.py and bench/sequence.py.

For every key, from two independent records: the archive in Postgres (each job's last
attempt: started_at in enqueue order, and each started at or after the previous one
finished, on the database clock) and the handlers' own ledger (every attempt, killed ones
included: begin lines in enqueue order, never two runs of a key overlapping, on
CLOCK_MONOTONIC). A run of a killed process with no end line ended at the latest when the
test saw it dead (`dead`: pid -> monotonic ns taken after it was gone). The run lines are
"begin <id> <pid> <ns> <key> <index>" and "end <id> <pid> <ns>" (tests/apps/sequenceapp.py);
a ledger that other handlers share names them otherwise (`tags`, e.g. faultapp's alo_seq
writes seq_begin / seq_end beside its own start / end lines).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bench.harness import read_ledger, sql

ARCHIVED = "SELECT id, state, started_at, finished_at FROM hivejobs_archive WHERE id = ANY(%s)"


@dataclass
class Run:
    job_id: str
    index: int  # the job's place in its key's enqueue order
    begin_ns: int
    end_ns: int


@dataclass
class Report:
    """What the checker found; `ok` when nothing is wrong."""

    jobs: int = 0
    lost: list[str] = field(default_factory=list)  # not archived succeeded
    pg_order: list[str] = field(default_factory=list)  # keys whose archive is out of order
    pg_overlap: list[str] = field(default_factory=list)
    ledger_order: list[str] = field(default_factory=list)
    ledger_overlap: list[str] = field(default_factory=list)
    runs: int = 0  # handler runs in the ledger (attempts, killed ones included)

    @property
    def ok(self) -> bool:
        return not (
            self.lost or self.pg_order or self.pg_overlap or self.ledger_order
            or self.ledger_overlap
        )  # fmt: skip


def ledger_runs(
    folder: Path, dead: dict[int, int], tags: tuple[str, str] = ("begin", "end")
) -> dict[str, list[Run]]:
    """Every handler run per key (the payload's account), in begin order."""
    begins: dict[tuple[str, int], tuple[int, str, int]] = {}
    runs: dict[str, list[Run]] = {}
    for parts in read_ledger(folder):
        if parts[0] == tags[0]:
            begins[(parts[1], int(parts[2]))] = (int(parts[3]), parts[4], int(parts[5]))
        elif parts[0] == tags[1]:
            begin, account, index = begins.pop((parts[1], int(parts[2])))
            runs.setdefault(account, []).append(Run(parts[1], index, begin, int(parts[3])))
    for (job_id, pid), (begin, account, index) in begins.items():
        if pid not in dead:
            raise AssertionError(f"a run of live pid {pid} never ended ({job_id})")
        runs.setdefault(account, []).append(Run(job_id, index, begin, dead[pid]))
    for key_runs in runs.values():
        key_runs.sort(key=lambda r: r.begin_ns)
    return runs


def check(
    url: str,
    folder: Path,
    lines: dict[str, list[str]],
    dead: dict[int, int],
    tags: tuple[str, str] = ("begin", "end"),
) -> Report:
    """Check every key's line of job ids (in enqueue order) against both records."""
    report = Report(jobs=sum(len(ids) for ids in lines.values()))
    for account, ids in lines.items():
        rows = {r[0]: r for r in sql(url, ARCHIVED, (ids,))}
        report.lost += [i for i in ids if i not in rows or rows[i][1] != "succeeded"]
        done = [rows[i] for i in ids if i in rows]
        if any(a[2] > b[2] for a, b in zip(done, done[1:], strict=False)):
            report.pg_order.append(account)
        overlaps = [(a[0], b[0]) for a, b in zip(done, done[1:], strict=False) if b[2] < a[3]]
        if overlaps:
            report.pg_overlap.append(f"{account}: {overlaps[0]}")
    for account, runs in ledger_runs(folder, dead, tags).items():
        report.runs += len(runs)
        if any(a.index > b.index for a, b in zip(runs, runs[1:], strict=False)):
            report.ledger_order.append(account)
        if any(b.begin_ns < a.end_ns for a, b in zip(runs, runs[1:], strict=False)):
            report.ledger_overlap.append(account)
    return report
