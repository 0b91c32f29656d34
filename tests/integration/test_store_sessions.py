"""The session settings a store's connections carry, against real Postgres: a store whose
session commits asynchronously, and its synchronous() view on the same connections (the
at-most-once lanes of a pool process beside at-least-once ones, worker/process.py)."""

from __future__ import annotations

import pytest

from hivejobs.store import Store

SETTINGS = "SELECT current_setting('synchronous_commit'), current_setting('lock_timeout')"


def settings(store: Store) -> tuple[tuple[str, str], tuple[str, str]]:
    """What a statement outside a transaction sees, then one inside a transaction."""
    with store.connection() as conn:
        alone = conn.execute(SETTINGS).fetchone()
        with conn.transaction():
            inside = conn.execute(SETTINGS).fetchone()
    assert alone is not None and inside is not None
    return (alone[0], alone[1]), (inside[0], inside[1])


@pytest.mark.parametrize("pooled", [False, True])
def test_the_synchronous_view_commits_synchronously_and_keeps_the_rest(
    database_url: str, pooled: bool
) -> None:
    session = {"synchronous_commit": "off", "lock_timeout": "1234"}
    # One connection: the view and the store take turns on the same one.
    store = Store(database_url, max_size=1, session=session, pooled=pooled, synchronous_view=True)
    try:
        synchronous = store.synchronous()
        assert settings(store) == (("off", "1234ms"),) * 2
        assert settings(synchronous) == (("on", "1234ms"),) * 2
        assert settings(store) == (("off", "1234ms"),) * 2  # the view's change ended with it
    finally:
        store.close()


def test_a_synchronous_view_must_be_asked_for_at_construction(database_url: str) -> None:
    store = Store(database_url, max_size=1, session={"synchronous_commit": "off"})
    try:
        with pytest.raises(ValueError, match="synchronous_view=True"):
            store.synchronous()
    finally:
        store.close()


@pytest.mark.parametrize(
    ("query", "expected"),
    [("", "hivejobs pool resize"), ("application_name=mine", "mine")],
)
def test_a_store_names_its_connections_by_role_unless_the_url_does(
    database_url: str, query: str, expected: str
) -> None:
    """pg_stat_activity says which process of a fleet holds a connection; an operator's
    application_name in the URL is kept."""
    url = database_url + (("&" if "?" in database_url else "?") + query if query else "")
    store = Store(url, max_size=1, role="hivejobs pool resize")
    try:
        with store.connection() as conn:
            row = conn.execute("SELECT current_setting('application_name')").fetchone()
        assert row is not None and row[0] == expected
    finally:
        store.close()
