"""The dashboard's chain page of a 20,000-job chain with 20,000 tries in its log: numbered
pages of a bounded size (it is re-fetched every two seconds while open), a count by state
instead of an unreadable graph, and every job and try reachable page by page."""

from __future__ import annotations

import re
from collections.abc import Callable

from hivejobs import App
from hivejobs.chains import Chain
from tests.harness import sql
from tests.web.conftest import Server

JOBS = 20_000


def test_a_huge_chain_page_is_paginated(
    server: Server, make_app: Callable[..., App], database_url: str
) -> None:
    app = make_app()
    app.job("echo")(lambda ctx, payload: payload)
    chain = Chain("huge")
    for i in range(JOBS):
        chain.job("echo", {"text": str(i)}, key=f"k{i:05d}")
    chain_id = app.run_chain(chain)
    sql(
        database_url,
        "INSERT INTO hivejobs_job_log (chain_id, key, try, name, job_id, state, finished_at, "
        "error) SELECT %s, 'k' || lpad(i::text, 5, '0'), 1, 'echo', 'j' || i, 'failed', "
        "now() + i * interval '1 ms', repeat('e', 2000) || 'RuntimeError: the end' "
        "FROM generate_series(0, %s) i",
        (chain_id, JOBS - 1),
    )
    path = f"/dashboard/chains/{chain_id}"
    first = server.client.get(path, params={"fragment": "1"})
    assert first.status_code == 200
    assert len(first.content) < 200_000, len(first.content)
    assert f"{JOBS} jobs: {JOBS} pending" in first.text  # no 20,000-box graph
    assert "page 1 of 200" in first.text and "next page" in first.text
    assert f"Job log ({JOBS} tries)" in first.text
    assert ">k00000<" in first.text and ">k00100<" not in first.text
    assert "RuntimeError: the end" in first.text  # a long error keeps its tail
    last = server.client.get(path, params={"page": "200", "fragment": "1"})
    assert len(last.content) < 200_000
    assert ">k19999<" in last.text and "previous page" in last.text
    assert len(re.findall(r">k199\d{2}<", last.text)) == 2 * 100  # jobs table and log
    assert server.client.get(path, params={"page": "0"}).status_code == 422


def test_jobs_added_at_run_time_are_in_the_graph_and_table(
    server: Server, make_app: Callable[..., App]
) -> None:
    """ctx.chain.add: the added jobs are boxes of the DAG (dashed, naming their adder), with
    edges from their predecessors, and rows of the jobs table."""
    from tests.integration.test_chain_growth import running_root

    app = make_app()
    chain_id, context = running_root(app)
    ctx = context()
    assert ctx.chain is not None
    more = ctx.chain.grow()
    parts = [more.job("step") for _ in range(2)]
    more.job("step", name="join", after=parts, before=["c"])
    ctx.chain.add(more)
    page = server.client.get(f"/dashboard/chains/{chain_id}", params={"fragment": "1"}).text
    added = re.findall(r'data-key="([^"]+)" data-state="pending" data-added-by="root"', page)
    assert sorted(added) == ["root.1", "root.2", "root.join"]
    assert page.count('stroke-dasharray="4 3"') == 3
    # root->b, b->c, root->each part, each part->join, and the new join->c
    assert page.count('marker-end="url(#arrow)"') == 7
    assert re.search(r"<td>root\.join</td>.*?<td>root</td></tr>", page)
