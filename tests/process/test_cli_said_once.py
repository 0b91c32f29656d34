"""A one-shot command says each thing once: its answer on stdout (and, for replay, what
changed on stderr), not a second time in a log line about the same act."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from hivejobs import App
from tests.process.cli import cli_env, hivejobs


def test_replay_and_chain_run_say_it_once(
    make_app: Callable[..., App], instance_env: dict[str, str], tmp_path: Path
) -> None:
    from tests.apps.controlapp import app as declared

    app = make_app()
    app.types.update(declared.types)
    job_id = app.enqueue("quick", {})
    assert app.cancel(job_id)  # queued: cancelled at once, a finished job to replay
    hj = {k: v for k, v in instance_env.items() if k.startswith("HIVEJOBS_")}
    env = cli_env(**hj, HIVEJOBS_APP="tests.apps.controlapp:app")

    replay = hivejobs(["replay", job_id], env)
    assert replay.returncode == 0, replay.stderr
    assert replay.stderr.splitlines() == ["kept priority 0"]

    chain = tmp_path / "chain.json"
    chain.write_text(
        json.dumps({"name": "c", "jobs": [{"key": "a", "type": "quick", "payload": {}}]})
    )
    run = hivejobs(["chain", "run", str(chain)], env)
    assert run.returncode == 0, run.stderr
    assert run.stderr == "" and len(run.stdout.split()) == 1

    # Asked for, the INFO lines are still there.
    loud = hivejobs(["chain", "run", str(chain)], {**env, "HIVEJOBS_LOG_LEVEL": "INFO"})
    assert "chain stored" in loud.stderr
