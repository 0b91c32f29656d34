"""The shape every coordinator service has, so that the coordinator is a loop over them.

A service does one pass of leader-only work in `run_once(lease)`: tests drive it one pass at
a time, and the coordinator calls it every `interval_s` while it holds the lease. A pass
whose guarded store verb returns None (the lease was lost) ends early and writes nothing
more; the next leader's pass carries on from what is stored.
"""

from __future__ import annotations

from typing import Protocol

from hivejobs.records.dispatch import Lease


class Service(Protocol):
    """One leader-only job: `name` (its log key), `interval_s`, `run_once(lease)`."""

    @property
    def name(self) -> str: ...

    @property
    def interval_s(self) -> float: ...

    def run_once(self, lease: Lease) -> object: ...
