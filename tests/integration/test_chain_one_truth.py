"""`chain status` and `chain ps` tell one truth: a chain job whose try waits for a worker
(dispatched, or given back by a shutdown) is queued in both, not running in one of them."""

from __future__ import annotations

from collections.abc import Callable

from hivejobs import App, Chain, JobContext
from hivejobs.chains.render import render
from hivejobs.coordinator.traverser import Traverser
from tests.integration.test_coordinator import leader


def test_a_try_waiting_for_a_worker_is_queued_in_status_and_ps(
    make_app: Callable[..., App],
) -> None:
    app = make_app()

    @app.job("step")
    def step(ctx: JobContext, payload: None) -> None: ...

    app.connections.store.upsert_job_types([app.types["step"].info()])
    chain = Chain("pair")
    first = chain.job("step", key="a")
    chain.job("step", key="b", after=[first])
    request_id = app.run_chain(chain)
    # The traverser hands "a" to the queue; no worker runs, so it waits there.
    Traverser(app.connections.store, app.connections.broker).run_once(leader(app))

    (tried,) = app.chain_ps()
    assert (tried.key, tried.state) == ("a", "queued")
    status = app.chain_status(request_id)
    assert [(j.key, j.state, j.job_state) for j in status.jobs][0] == ("a", "running", "queued")
    text = render(status)
    row = next(line for line in text.splitlines() if line.startswith("  [") and " a " in line)
    assert "queued" in row and "running" not in row, text
    assert "no try runs now: 1 waiting for a worker" in text.splitlines()[0]
