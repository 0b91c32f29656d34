"""bench/pressure.py at a second a "minute": every pressure cell runs on a fresh machine
(a throwaway cluster, the producer, the pinned xmin, the readers, the overload, the backend
kills, the idle connections) and loses no job. The figures are the bench's; this checks that
it runs and what must hold whatever the machine's speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench.pressure import CELLS, PLAN

pytestmark = pytest.mark.faults  # a cluster of its own and a real worker: the heavy group
ROOT = Path(__file__).resolve().parents[2]


def test_every_pressure_cell_runs_and_loses_nothing(tmp_path: Path) -> None:
    out = tmp_path / "pressure.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    cmd = [sys.executable, "bench/pressure.py", "--minute-s", "1", "--backlog-jobs", "500"]
    proc = subprocess.run(
        [*cmd, "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["lost"] == 0
    assert result["left_unfinished"] == 0
    assert result["backends_terminated"] > 0  # the terminate cell reached the worker
    phases = {row["phase"] for row in result["rows"]}
    assert phases == {phase for cell in CELLS for phase, _, _ in PLAN[cell]}
    for row in result["rows"]:
        assert set(row["tables"]) == {"hivejobs_job", "hivejobs_archive"}
        assert row["worker_rss_mb"]  # every worker process measured
