"""`hivejobs bench --scenarios chain`: hop latency and a 1,000-job chain of width 50.

Hop = a chain job's claim minus its predecessor's completion commit, both on the database
clock (the coordinator's share of a chain: notice, traverse, enqueue, dispatch, claim).
"""

from __future__ import annotations

import time

from hivejobs.bench.environment import BenchEnvironment
from hivejobs.bench.percentiles import percentiles
from hivejobs.bench.scenarios import Figures, Progress
from hivejobs.chains.builder import Chain, ChainJob

STEP = "bench_step"


def _wait(env: BenchEnvironment, request_id: str, label: str, progress: Progress) -> None:
    assert env.app is not None
    began, deadline = time.perf_counter(), time.perf_counter() + 600
    while True:
        status = env.app.chain_status(request_id)
        done = sum(1 for j in status.jobs if j.state == "succeeded")
        progress(label, done, len(status.jobs), time.perf_counter() - began)
        if status.state == "succeeded":
            return
        if status.state in ("failed", "stopped") or time.perf_counter() > deadline:
            raise RuntimeError(f"{label}: chain ended {status.state}; see {env.workdir}")
        time.sleep(0.05)  # progress polling interval


def chain_scenario(
    env: BenchEnvironment,
    processes: int,
    progress: Progress,
    hops: int = 100,
    width: int = 50,
    layers: int = 20,
) -> Figures:
    app = env.app
    assert app is not None
    env.start_worker(processes, 8, 0.0)
    line = Chain("bench-hops")
    prev: ChainJob | None = None
    for i in range(hops):
        prev = line.job(STEP, {}, key=f"h{i:04d}", after=[prev] if prev else [])
    request_id = app.run_chain(line)
    _wait(env, request_id, "chain hops", progress)
    jobs = {j.key: j for j in app.chain_status(request_id).jobs}
    gaps = []
    for i in range(hops - 1):
        before, after = jobs[f"h{i:04d}"], jobs[f"h{i + 1:04d}"]
        assert before.finished_at is not None and after.started_at is not None
        gaps.append((after.started_at - before.finished_at).total_seconds() * 1000)
    hop_p50, hop_p99 = percentiles(gaps, 50, 99)

    mesh = Chain("bench-mesh")
    layer: list[ChainJob] = []
    for n in range(layers):
        layer = [
            mesh.job(
                STEP,
                {},
                key=f"l{n:02d}j{i:02d}",
                after=[layer[i], layer[(i + 1) % width]] if layer else [],
            )
            for i in range(width)
        ]
    began = time.perf_counter()
    _wait(env, app.run_chain(mesh), "chain 1,000 jobs", progress)
    mesh_s = time.perf_counter() - began
    env.stop_worker()
    return {
        "chain_hop_p50_ms": hop_p50,
        "chain_hop_p99_ms": hop_p99,
        f"chain_{width * layers}_jobs_width_{width}_s": mesh_s,
    }
