"""Every malformed chain is refused with ChainInvalid before anything is stored."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hivejobs import App, Chain, ChainInvalid, HivejobsError
from tests.harness import ROOT, sql


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    from tests.apps.chainapp import app as declared

    app = make_app()
    app.types.update(declared.types)
    return app


def refused(app: App, chain: Chain, *needles: str) -> None:
    with pytest.raises(ChainInvalid) as info:
        app.run_chain(chain)
    for needle in needles:
        assert needle in str(info.value)


def test_chain_invalid_is_a_hivejobs_error() -> None:
    assert issubclass(ChainInvalid, HivejobsError)


def test_every_validation_error_stores_nothing(app: App, database_url: str) -> None:
    cyc = Chain("cycle")
    cyc.job("step", key="a", after=["c"])
    cyc.job("step", key="b", after=["a"])
    cyc.job("step", key="c", after=["b"])
    cyc.job("step", key="d", after=["a"])
    refused(app, cyc, "cycle", "a -> b -> c -> a")

    own = Chain("self")
    own.job("step", key="a", after=["a"])
    refused(app, own, "cycle", "a -> a")

    unknown = Chain("unknown-type")
    unknown.job("stpe", key="x")
    refused(app, unknown, "'x'", "unknown job type 'stpe'", "did you mean 'step'")

    refused(app, Chain("empty"), "empty")

    dangling = Chain("dangling")
    dangling.job("step", key="a", after=["nope"])
    refused(app, dangling, "'nope'", "not a job of this chain")

    two_starts = Chain("two-starts")
    a = two_starts.job("step", key="a")
    b = two_starts.job("step", key="b")
    c = two_starts.job("step", key="c", after=[a, b])
    two_starts.sequence([a, b, c], retries=1)
    refused(app, two_starts, "exactly one start job", "a, b")

    entered_twice = Chain("entered-twice")
    a = entered_twice.job("step", key="a")
    x = entered_twice.job("step", key="x")
    b = entered_twice.job("step", key="b", after=[a, x])
    entered_twice.sequence([a, b], retries=1)
    refused(app, entered_twice, "exactly one start job", "a, b")

    loose = Chain("disconnected")
    a = loose.job("step", key="a")
    b = loose.job("step", key="b", after=[a])
    c = loose.job("step", key="c", after=[a])
    d = loose.job("step", key="d", after=[c])
    loose.sequence([a, b, d], retries=1)
    refused(app, loose, "exactly one start job")  # d is entered from c, outside

    bad_payload = Chain("payload")
    bad_payload.job("step", {"x": object()}, key="p")
    refused(app, bad_payload, "'p'")

    assert sql(database_url, "SELECT count(*) FROM hivejobs_chain")[0][0] == 0
    assert sql(database_url, "SELECT count(*) FROM hivejobs_job")[0][0] == 0


def test_builder_refuses_a_job_of_another_chain_and_duplicate_keys() -> None:
    one, two = Chain("one"), Chain("two")
    a = one.job("step", key="a")
    with pytest.raises(ChainInvalid, match="another chain"):
        two.job("step", key="b", after=[a])
    with pytest.raises(ChainInvalid, match="another chain"):
        two.sequence([a])
    with pytest.raises(ChainInvalid, match="already has a job 'a'"):
        one.job("step", key="a")
    with pytest.raises(ChainInvalid, match="job key"):
        one.job("step", key="a:b")


def test_json_chain_round_trip_and_cli(
    app: App, database_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    chain = Chain("provision-db", args={"host": "db1"})
    vm = chain.job("step", {"n": 4}, key="vm", tries=3)
    sql_ = chain.job("step", {}, key="sql", after=[vm])
    chain.job("merge", {"expect": 1}, key="rep", after=[sql_])
    chain.sequence([vm, sql_], retries=2, retry_wait=10.0)
    again = Chain.from_json(chain.to_json())
    assert again.to_json() == chain.to_json()

    path = tmp_path / "chain.json"
    path.write_bytes(chain.to_json())
    env = {
        "HIVEJOBS_DATABASE_URL": database_url,
        "HIVEJOBS_PREFIX": redis_prefix,
        "HIVEJOBS_APP": "tests.apps.chainapp:app",
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),  # this checkout's code
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hivejobs", "chain", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )

    run = cli("run", str(path))
    assert run.returncode == 0, run.stderr
    request_id = run.stdout.strip()
    status = cli("status", request_id)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert "provision-db" in lines[0] and "PENDING" in lines[0]
    layer_rows = [ln for ln in lines if ln.startswith("layer") or ln.startswith("  [")]
    assert [ln.split()[0:2] for ln in layer_rows if ln.startswith("layer")] == [
        ["layer", "0"],
        ["layer", "1"],
        ["layer", "2"],
    ]
    assert "try 0/3" in next(ln for ln in lines if " vm " in ln)
    assert request_id in cli("list").stdout
    assert cli("stop", request_id).stdout.strip() == "stop requested"
    path.write_text('{"name": "bad", "jobs": [{"key": "a", "type": "step", "after": ["a"]}]}')
    bad = cli("run", str(path))
    assert bad.returncode == 2 and "cycle" in bad.stderr
    assert cli("status", "nope").returncode == 1


def test_whole_second_waits_beside_fractional_ones_are_stored(app: App, database_url: str) -> None:
    """`retry_wait=30` (an int, as a reader writes it) beside a default 0.0 in one chain."""
    chain = Chain("waits")
    first = chain.job("step", {}, key="a", tries=2, retry_wait=30)
    chain.job("step", {}, key="b", after=[first])
    chain.sequence([first], retries=1, retry_wait=5)
    request_id = app.run_chain(chain)
    rows = sql(
        database_url,
        "SELECT key, retry_wait_s FROM hivejobs_chain_job WHERE chain_id = %s ORDER BY key",
        (request_id,),
    )
    assert rows == [("a", 30.0), ("b", 0.0)]
