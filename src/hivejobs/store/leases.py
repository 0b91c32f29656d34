"""The coordinator lease (leases.sql): acquire, renew, resign, read, and the guard that every
leader-only write runs under.

A lease is (holder, term). The term grows on every change of holder; a guarded write's
transaction starts with `hold_lease`, which share-locks the lease row, so a write of an old
term can never land after a new term began: the takeover waits for that transaction to end
(rule R7 in docs/concepts/reliability.md: a lease with a term, checked by every write).
Decides nothing: the elector (coordinator/elector.py) decides when to renew or step down.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from psycopg.rows import class_row

from hivejobs.records.dispatch import Lease, LeaseInfo
from hivejobs.store.db import Conn, Database
from hivejobs.store.sql import load_queries

LEASES = load_queries("leases.sql")


def hold_lease(conn: Conn, lease: Lease | tuple[str, int]) -> bool:
    """Inside a transaction: True, and the lease row share-locked, while `lease` holds."""
    params = {"holder": lease[0], "term": lease[1]}
    return conn.execute(LEASES["lease_hold"], params).fetchone() is not None


class Leases(Database):
    """The lease row's statements. Owns no state: the term lives in the row."""

    def lease_acquire(self, holder: str, ttl_s: float) -> int | None:
        """The term when we hold the lease after this call, else None."""
        with self.connection() as conn:
            row = conn.execute(
                LEASES["lease_acquire"], {"holder": holder, "ttl_s": ttl_s}
            ).fetchone()
        return None if row is None else int(row[0])

    def lease_resign(self, holder: str) -> None:
        """Give the lease up at shutdown: a follower takes over at its next tick instead of
        after the TTL."""
        with self.connection() as conn:
            conn.execute(LEASES["lease_resign"], {"holder": holder})

    def lease_read(self) -> LeaseInfo | None:
        """The lease row as it is (for /metrics); None before any coordinator ran."""
        with self.connection() as conn:
            cur = conn.cursor(row_factory=class_row(LeaseInfo))
            return cur.execute(LEASES["lease_read"]).fetchone()

    def nothing_to_write(self, probe: str) -> bool:
        """True when `probe`, a read-only query that looks for the rows a guarded verb would
        write, finds none: then the verb needs no transaction. A guarded
        transaction is four round trips (BEGIN, the lease's FOR SHARE, the statement,
        COMMIT) and its row lock takes a transaction id and a WAL record; an idle
        coordinator's sweeps ran seven a second. The probe is one round trip in autocommit
        with neither. Work that appears just after the probe is the next pass's, as work
        committed just after a guarded statement's snapshot always was.

        Prepared like any statement: on the coordinator's session the plan it keeps reads
        its index whatever the table was when it was made (PREPARED_PLANS,
        session_settings.py).
        Planned at every call, the promoter's probe cost twenty times its execution (0.14
        against 0.008 ms)."""
        with self.connection() as conn:
            return conn.execute(probe).fetchone() is None

    @contextmanager
    def leader_transaction(self, lease: Lease | tuple[str, int]) -> Iterator[Conn | None]:
        """A transaction under `lease`: the connection, or None when the lease no longer
        holds (then nothing may be written)."""
        with self.connection() as conn, conn.transaction():
            yield conn if hold_lease(conn, lease) else None
