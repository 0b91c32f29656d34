"""Fair and sequenced jobs mixed into chaos S1, S3 and S4 ("0 lost, order kept").

Beside each scenario's own jobs, a share goes to tests/apps/faultapp.py's `alo_fair`
(fair_by="k") and `alo_seq` (sequence_by="k") over a handful of keys. Both are at-least-once
jobs like `alo`, so the scenario's own checker judges them lost or run twice; the sequenced
ones are judged besides by bench/sequence_check.py, the checker of the sequence tests: per
key, from the archive and from the handlers' ledger, every run begins in enqueue order and
none overlaps the previous one, where a run of a process killed with kill -9 ends at its kill
(Scenario.dead) and a run of a pool that exited on SIGTERM ends at its exit. As
docs/howto/sequences.md says where the guarantee ends, the check is on claims: a killed run's
job is re-run as its key's current job, after the kill.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from bench.chaoslib import Row, Scenario
from bench.harness import read_ledger, sql
from bench.sequence_check import check

from hivejobs import App

KEYED_TYPES = ["alo_seq", "alo_fair"]
TAGS = ("seq_begin", "seq_end")  # alo_seq's run record ("end" is alo's line)


@dataclass
class Keyed:
    """The keyed jobs of one scenario: fair ids, and each key's line of sequenced ids."""

    fair: list[str] = field(default_factory=list)
    lines: dict[str, list[str]] = field(default_factory=dict)
    at_faults: list[int] = field(default_factory=list)  # sequenced jobs live at each fault

    @property
    def ids(self) -> list[str]:
        return self.fair + [i for line in self.lines.values() for i in line]

    def enqueue(
        self,
        app: App,
        keys: int,
        fair_jobs: int,
        per_key: int,
        ms: tuple[int, int],
        rng: random.Random,
        batch: bool = True,
    ) -> None:
        """`fair_jobs` fair jobs (half on key k0, the rest spread: one busy key among quiet
        ones) and `per_key` sequenced jobs for each of `keys` keys, round by round, so the
        keys' lines interleave; a later call continues the lines. `batch`: one enqueue_many
        per type (its order is each key's), else one enqueue per job (e.g. while Redis is
        down)."""
        names = [f"k{k}" for k in range(keys)]
        fair = [
            {"k": "k0" if rng.random() < 0.5 else rng.choice(names), "ms": rng.randint(*ms)}
            for _ in range(fair_jobs)
        ]
        place = {k: len(self.lines.setdefault(k, [])) for k in names}
        seq = []
        for i in range(per_key):
            seq += [{"k": k, "i": place[k] + i, "ms": rng.randint(*ms)} for k in names]
        if batch:
            self.fair += app.enqueue_many("alo_fair", fair)
            ids = app.enqueue_many("alo_seq", seq)
        else:
            self.fair += [app.enqueue("alo_fair", p) for p in fair]
            ids = [app.enqueue("alo_seq", p) for p in seq]
        for payload, job_id in zip(seq, ids, strict=True):
            self.lines[str(payload["k"])].append(job_id)

    def note_fault(self, s: Scenario) -> None:
        """Before a fault: how many sequenced jobs it meets (the notes show it did meet some)."""
        live = "SELECT count(*) FROM hivejobs_job WHERE name = 'alo_seq'"
        self.at_faults.append(int(sql(s.url, live)[0][0]))

    def judge(self, s: Scenario, row: Row) -> Row:
        """Add the sequence check to a row that s.result() made (lost and twice included
        these jobs already), and say in its notes what the keyed jobs met."""
        try:
            report = check(s.url, s.ledger, self.lines, s.dead, TAGS)
        except AssertionError as exc:  # a run of a live process with no end
            s.check(False, f"sequence ledger: {exc}")
            return s.rejudge(row)
        s.check(
            report.ok,
            f"sequence: lost {len(report.lost)}, order pg {report.pg_order} ledger "
            f"{report.ledger_order}, overlap pg {report.pg_overlap[:2]} ledger "
            f"{report.ledger_overlap}",
        )
        seq_pids = {int(p[2]) for p in read_ledger(s.ledger) if p[0] == TAGS[0]}
        notes = (
            f"keyed: {len(self.fair)} fair, {len(self.lines)} keys x "
            f"{max(map(len, self.lines.values()))} sequenced; {len(seq_pids & set(s.dead))} "
            f"alo_seq pools killed or stopped, {report.runs - len(self.ids) + len(self.fair)} "
            "alo_seq re-runs"
        )
        if self.at_faults:
            notes += f"; alo_seq live at the faults: {'/'.join(map(str, self.at_faults))}"
        if s.reruns:
            notes += f"; {s.reruns} re-runs by design (suspended as their handler ended)"
        return s.rejudge(row, notes=notes)
