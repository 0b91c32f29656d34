#!/usr/bin/env python3
"""Run the benchmark's own harness natively, with hivejobs registered as one of its systems.

    PJQB_DIR=/tmp/pjqb /tmp/pjqb/.venv/bin/python bench/independent/native/run_harness.py \\
        run --systems hivejobs,procrastinate --scenario chaos_pg_backend_kill

PJQB_DIR is a checkout of postgresql-job-queue-benchmarking with a virtualenv (.venv) holding
its harness's dependencies and the peers' adapter dependencies. This script changes none of
its files: it puts the `docker` shim beside it first on PATH (Postgres becomes a throwaway
local cluster, `docker run IMAGE` the adapter's native command), adds `hivejobs` to the
harness's adapter registry (its four registration touchpoints, done in memory: the manifest
is ../hivejobs-bench/adapter.json, the launcher runs ../hivejobs-bench/main.py with
HIVEJOBS_PYTHON, an interpreter that imports hivejobs), and calls the harness's main with
the arguments given. Results go where the harness puts them: PJQB_DIR/results/<run id>/.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ADAPTER_DIR = HERE.parent / "hivejobs-bench"


def main() -> int:
    pjqb = Path(os.environ.get("PJQB_DIR", "/tmp/pjqb")).resolve()
    os.environ["PJQB_DIR"] = str(pjqb)
    os.environ["PATH"] = f"{HERE}{os.pathsep}{os.environ.get('PATH', '')}"
    # The contract's default for bulk producers; procrastinate's adapter alone defaults to 1
    # (a row per insert), which caps its producer below the offered rate on a busy machine.
    os.environ.setdefault("PRODUCER_BATCH_MAX", "128")
    sys.path.insert(0, str(pjqb))
    from bench_harness import adapters  # the harness's own registry
    from bench_harness.orchestrator import main as harness_main

    python = os.environ.get("HIVEJOBS_PYTHON", "python3")

    def launch_hivejobs(
        manifest: adapters.AdapterManifest, overrides: dict[str, str]
    ) -> adapters.LaunchSpec:
        env = adapters._base_env(manifest, overrides)
        return adapters.LaunchSpec(argv=[python, str(ADAPTER_DIR / "main.py")], env=env)

    adapters.ADAPTERS["hivejobs"] = adapters.AdapterEntry(
        bench_dir=ADAPTER_DIR, builder=lambda skip: None, launcher=launch_hivejobs
    )
    os.chdir(pjqb)
    return int(harness_main(sys.argv[1:]))


if __name__ == "__main__":
    raise SystemExit(main())
