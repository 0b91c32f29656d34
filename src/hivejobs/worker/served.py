"""ServedApp: what the worker needs of the App it serves, as a Protocol the App satisfies.

`hivejobs run myapp.jobs:app` hands the supervisor the user's App; the worker reads its
registry (types, schedules, process-start hooks), resolves its connection URLs before forking,
and asks it for each attempt's context, so that a handler's `ctx` is the public JobContext
(its `app` typed as the App) while the worker, below client/ in the layers, never imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from hivejobs.jobtypes import JobType
    from hivejobs.records.fleet import Schedule
    from hivejobs.records.jobs import ClaimedJob
    from hivejobs.store.chains import ChainStore
    from hivejobs.worker.context import AttemptContext
    from hivejobs.worker.streaming import EventSink


class Resolving(Protocol):
    """The App's connections as the supervisor uses them."""

    def resolve(self) -> object:
        """Settle the database and Redis URLs (before forking: children inherit them)."""
        ...


class ServedApp(Protocol):
    """The App as the worker sees it: read-only once the app module is imported."""

    @property
    def types(self) -> Mapping[str, JobType]: ...

    @property
    def schedules(self) -> Mapping[str, Schedule]: ...

    @property
    def process_start_hooks(self) -> Sequence[Callable[[], object]]: ...

    @property
    def connections(self) -> Resolving: ...

    def job_context(
        self, job: ClaimedJob, chains: ChainStore | None = None, events: EventSink | None = None
    ) -> AttemptContext:
        """The context a handler of this app is handed for `job`'s attempt."""
        ...
