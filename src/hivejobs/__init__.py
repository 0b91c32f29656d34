"""hivejobs: a durable job runtime for Python services (Redis broker, Postgres truth).

Public API only. Imported by a web app, hivejobs is a library and stays silent: its log
lines are disabled here, and `hivejobs` commands (or the host app) enable them.
"""

from loguru import logger

from hivejobs.chains import Chain, ChainInfo, ChainJob
from hivejobs.client.app import App, JobContext
from hivejobs.client.batches import AsyncBatch, Batch
from hivejobs.debounce import Unique
from hivejobs.errors import (
    BatchClosed,
    BatchInvalid,
    BatchNotFound,
    ChainInvalid,
    ChainNotFound,
    ChainStopPending,
    ConfigError,
    ConnectionFailed,
    HivejobsError,
    Interrupted,
    InvalidArgument,
    InvalidJobType,
    JobDuplicate,
    JobIdConflict,
    JobNotFinished,
    JobNotFound,
    NotAnAncestor,
    PayloadInvalid,
    PayloadTooLarge,
    SchemaMissing,
    SchemaOutdated,
    UnknownJobType,
    WaitTimeout,
)
from hivejobs.jobtypes import Backoff, Fail, Retry
from hivejobs.records.batches import BatchDone, BatchStatus
from hivejobs.records.events import JobEvent
from hivejobs.records.jobs import JobInfo, JobState

logger.disable("hivejobs")

__all__ = [
    "App",
    "AsyncBatch",
    "Batch",
    "BatchClosed",
    "BatchDone",
    "BatchInvalid",
    "BatchNotFound",
    "BatchStatus",
    "Backoff",
    "Chain",
    "ChainInfo",
    "ChainInvalid",
    "ChainJob",
    "ChainNotFound",
    "ChainStopPending",
    "ConfigError",
    "ConnectionFailed",
    "Fail",
    "HivejobsError",
    "Interrupted",
    "InvalidArgument",
    "InvalidJobType",
    "JobContext",
    "JobDuplicate",
    "JobIdConflict",
    "JobEvent",
    "JobInfo",
    "JobNotFinished",
    "JobNotFound",
    "WaitTimeout",
    "JobState",
    "NotAnAncestor",
    "PayloadInvalid",
    "PayloadTooLarge",
    "Retry",
    "SchemaMissing",
    "SchemaOutdated",
    "Unique",
    "UnknownJobType",
]
