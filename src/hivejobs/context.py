"""JobContext: what a handler knows about the attempt it runs, and how it is told to stop."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from loguru import logger

from hivejobs.records import ClaimedJob

if TYPE_CHECKING:
    from loguru import Logger

    from hivejobs.app import App
    from hivejobs.broker import Broker


class JobContext:
    """Handed to every handler call.

    `stopping` is set when the worker shuts down, the job is cancelled, or its timeout passed:
    a long handler should check it and raise `hivejobs.Interrupted` (or return) promptly.
    """

    def __init__(self, job: ClaimedJob, app: App, broker: Broker) -> None:
        self.job_id = job.id
        self.name = job.name
        self.attempt = job.attempt
        self.attempts = job.attempts
        self.priority = job.priority
        self.delivery = job.delivery
        self.app = app
        self.stopping = threading.Event()
        self.cancelled = False
        self.logger: Logger = logger.bind(job_id=job.id, job_type=job.name,
                                          attempt=job.attempt)
        self._broker = broker
