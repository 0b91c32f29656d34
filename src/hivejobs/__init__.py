"""hivejobs: a durable job runtime for Python services (Redis broker, Postgres truth).

Public API only.
"""

from hivejobs.app import App, Backoff, Retry
from hivejobs.chains import Chain, ChainInfo, JobRef
from hivejobs.context import JobContext
from hivejobs.errors import (
    ChainInvalid,
    ChainNotFound,
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
    PayloadInvalid,
    PayloadTooLarge,
    SchemaMissing,
    SchemaOutdated,
    UnknownJobType,
)
from hivejobs.records import JobInfo, JobState

__all__ = [
    "App",
    "Backoff",
    "Chain",
    "ChainInfo",
    "ChainInvalid",
    "ChainNotFound",
    "JobRef",
    "ConfigError",
    "ConnectionFailed",
    "HivejobsError",
    "Interrupted",
    "InvalidArgument",
    "InvalidJobType",
    "JobContext",
    "JobDuplicate",
    "JobIdConflict",
    "JobInfo",
    "JobNotFinished",
    "JobNotFound",
    "JobState",
    "PayloadInvalid",
    "PayloadTooLarge",
    "Retry",
    "SchemaMissing",
    "SchemaOutdated",
    "UnknownJobType",
]
