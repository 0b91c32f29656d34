"""Without servers: secrets redacted in every DSN form, settings and names checked
strictly, text escaped for terminals, dispatch notifications parsed one by one."""

from __future__ import annotations

import os

import pytest

from hivejobs import App, ChainInvalid, ConfigError, InvalidArgument, InvalidJobType
from hivejobs.chains import Chain
from hivejobs.config import settings_from_env
from hivejobs.display import escape
from hivejobs.records.dispatch import Push
from hivejobs.store.notify import parse_dispatch
from hivejobs.urls import redact_url, scrub, url_secrets

MARK = "Zq9MarkerPw"
NOWHERE = "postgresql://127.0.0.1:1/nowhere"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("HIVEJOBS_") or key in ("DATABASE_URL", "REDIS_URL"):
            monkeypatch.delenv(key)


# -- no secret in any output ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"postgresql://hj:{MARK}@db:5432/app", "postgresql://hj:***@db:5432/app"),
        (f"postgresql://db/app?user=hj&password={MARK}", "postgresql://hj:***@db/app"),
        (
            f"postgresql://hj@db/app?sslmode=require&password={MARK}",
            "postgresql://hj:***@db/app?sslmode=require",
        ),
        (f"host=db user=hj password={MARK} dbname=app", "user=hj password=*** dbname=app host=db"),
        (f"postgresql://hj:{MARK}%23x%2Fy@db/app", "postgresql://hj:***@db/app"),
        (f"redis://:{MARK}@cache:6379/0", "redis://:***@cache:6379/0"),
        (f"redis://user:{MARK}@cache:6379/2", "redis://user:***@cache:6379/2"),
        (f"redis://cache:6379/0?password={MARK}", "redis://:***@cache:6379/0"),
        (f"unix:///run/redis.sock?password={MARK}&db=1", "unix://:***@/run/redis.sock?db=1"),
        # Unencoded '#' or '/' in the password: libpq and redis-py read part of it as the port
        # or host; nothing of it may be shown.
        (f"postgresql://hj:{MARK}#x/y@db/app", "<malformed URL>"),
        (f"postgresql://hj:{MARK}/x@db/app", "<malformed URL>"),
        (f"redis://:{MARK}#x@cache:6379/0", "<malformed URL>"),
        (f"mysql://root:{MARK}@db/app", "mysql://root:***@db/app"),
    ],
)
def test_redact_url_hides_the_password_in_every_dsn_form(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert MARK not in redact_url(url)


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://hj:{MARK}#x/y@db/app",
        f"postgresql://hj:{MARK}/x@db/app",
        f"host=db user=hj password={MARK} port=5432x",
    ],
)
def test_a_malformed_database_url_is_refused_without_echoing_it(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        App(database_url=url, redis_url="redis://127.0.0.1:1/0")
    assert MARK not in str(info.value)
    assert "percent-encode" in str(info.value) or "malformed" in str(info.value)


def test_key_value_dsn_is_usable() -> None:
    app = App(database_url=f"host=127.0.0.1 port=1 user=hj password={MARK} dbname=x")
    assert app.settings.database_url.startswith("host=")


def test_settings_repr_hides_both_passwords() -> None:
    app = App(database_url=f"postgresql://hj:{MARK}@db/app", redis_url=f"redis://:{MARK}@c:1/0")
    for text in (repr(app.settings), str(app.settings), f"{app.settings}"):
        assert MARK not in text
        assert "postgresql://hj:***@db/app" in text and "redis://:***@c:1/0" in text


def test_scrub_removes_raw_encoded_and_query_passwords() -> None:
    url = f"postgresql://hj:{MARK}%2Fz@db/app?password={MARK}2"
    secrets = url_secrets(url)
    text = f"failed for {MARK}/z and {MARK}%2Fz and {MARK}2"
    assert MARK not in scrub(text, secrets)


# -- settings: durations finite and positive, counts whole ------------------------------------


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("HIVEJOBS_HEARTBEAT_S", "-1"),
        ("HIVEJOBS_HEARTBEAT_S", "0"),
        ("HIVEJOBS_HEARTBEAT_S", "nan"),
        ("HIVEJOBS_SHUTDOWN_TIMEOUT_S", "inf"),
        ("HIVEJOBS_STUCK_AFTER_S", "-inf"),
        ("HIVEJOBS_MAX_PAYLOAD_BYTES", "2.7"),
        ("HIVEJOBS_POISON_PILL_AFTER", "-5"),
    ],
)
def test_bad_numeric_setting_from_env_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=f"{var}={value!r}"):
        settings_from_env()


@pytest.mark.parametrize("value", [float("nan"), -1.0, 0.0, float("inf")])
def test_bad_duration_keyword_is_refused(value: float) -> None:
    with pytest.raises(ConfigError, match="heartbeat_s"):
        App(database_url=NOWHERE, heartbeat_s=value)


# -- names, prefixes, keys, ids ---------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["", "jobs:\n", "\njobs:"])
def test_empty_or_newline_prefix_is_refused(prefix: str) -> None:
    with pytest.raises(ConfigError, match="redis prefix"):
        settings_from_env(prefix=prefix)


def test_empty_prefix_from_env_is_refused_not_defaulted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HIVEJOBS_PREFIX", "")
    with pytest.raises(ConfigError, match="redis prefix ''"):
        settings_from_env()


def test_job_type_name_with_trailing_newline_is_refused() -> None:
    with pytest.raises(InvalidJobType):
        App(database_url=NOWHERE).job("resize\n")


def test_chain_key_with_trailing_newline_is_refused() -> None:
    with pytest.raises(ChainInvalid, match="job key"):
        Chain("c").job("resize", {}, key="a\n")


@pytest.mark.parametrize(
    "job_id",
    [
        "a\x00b",  # NUL (Cc)
        "a\x1b[2J",  # ESC (Cc)
        "a\u202eb",  # right-to-left override (Cf)
        "a\u200bb",  # zero-width space (Cf)
        "a\u2028b",  # line separator (Zl)
        "a\u2029b",  # paragraph separator (Zp)
        "caf\udce9",  # undecodable byte from argv or os.listdir (Cs)
    ],
)
def test_ids_with_control_format_or_separator_characters_are_refused(job_id: str) -> None:
    app = App(database_url=NOWHERE, redis_url="redis://127.0.0.1:1/0")
    app.job("resize")(lambda ctx, payload: None)
    with pytest.raises(InvalidArgument, match="job id"):
        app.enqueue("resize", {}, id=job_id)
    with pytest.raises(InvalidArgument, match="job id"):
        app.get_job(job_id)  # refused before any connection (the port is closed)


@pytest.mark.parametrize("job_id", [5, None, b"abc", ""])
def test_lookup_with_a_non_string_id_is_invalid_argument(job_id: object) -> None:
    app = App(database_url=NOWHERE, redis_url="redis://127.0.0.1:1/0")
    with pytest.raises(InvalidArgument, match="job id must be a string"):
        app.get_job(job_id)  # type: ignore[arg-type]


# -- terminal output --------------------------------------------------------------------------


def test_escape_shows_controls_format_and_separators() -> None:
    assert escape("plain text, é and 漢字") == "plain text, é and 漢字"
    assert escape("a\x1b[2Jb\nc\u202ed\u2028e\x00") == (
        "a\\u001b[2Jb\\u000ac\\u202ed\\u2028e\\u0000"
    )
    assert escape("\U000e0041") == "\\udb40\\udc41"  # a tag character, as a JSON UTF-16 pair


# -- dispatch notifications -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "parsed"),
    [
        ("resize\t3\tjob-1", [("job-1", "resize", 3)]),
        ("resize\t3\tjob-1\tjob-2", [("job-1", "resize", 3), ("job-2", "resize", 3)]),
        ("resize\t99\tjob-1", None),  # a list nothing pops
        ("resize\t-1\tjob-1", None),
        ("resize\tx\tjob-1", None),
        ("garbage", None),
        ("resize\n\t1\tjob-1", None),
        ("resize\t1\t", None),
        ("resize\t1", None),
    ],
)
def test_dispatch_payloads_are_parsed_one_by_one(payload: str, parsed: list[Push] | None) -> None:
    if parsed is None:
        with pytest.raises(ValueError):
            parse_dispatch(payload)
    else:
        assert parse_dispatch(payload) == parsed


# -- logging: a library stays silent; the CLI's setup keeps the host's sinks ------------------

LOGGING_CHILD = """
from loguru import logger
seen = []
logger.add(lambda message: seen.append(str(message)), level="DEBUG", format="{message} {extra}")
import hivejobs
from hivejobs.client.app import App
app = App(database_url="postgresql://127.0.0.1:1/x", redis_url="redis://:Zq9MarkerPw@127.0.0.1:1/0")
def push():  # the pusher's batch of committed ids; Redis is down: it logs a warning
    app.connections.pusher._push([("a", "resize", 0)])
push()
assert seen == [], seen  # imported as a library: silent
from hivejobs.logs import setup_logging
setup_logging("cli")
push()
assert len(seen) == 1 and "ConnectionError" in seen[0] and "Connection refused" in seen[0], seen
print("ok")
"""


def test_library_is_silent_until_enabled_and_setup_keeps_the_hosts_sinks() -> None:
    """loguru's advice for libraries: disabled at import; the CLI enables it and removes only
    the handlers it added. Errors are logged with their text, not redis-py's bare repr."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", LOGGING_CHILD], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert "Connection refused" in done.stderr  # our own sink, on stderr
    assert MARK not in done.stderr
