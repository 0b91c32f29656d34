"""Validation without servers: job types, enqueue options, Backoff, config, CLI exit codes.

The App here points at a Postgres port nothing listens on: every rejected call below proves
it was refused before the first write (a connection attempt would raise ConnectionFailed).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from hivejobs import (
    App,
    Backoff,
    ConfigError,
    InvalidArgument,
    InvalidJobType,
    JobContext,
    PayloadInvalid,
    PayloadTooLarge,
    cli,
)
from hivejobs.config import DEFAULT_DATABASE_URL, Settings, settings_from_env
from hivejobs.urls import redact_url

NOWHERE = "postgresql://hj:s3cret@127.0.0.1:1/nowhere"


class Resize(msgspec.Struct):
    width: int
    height: int


# Loaded by the CLI tests with --app tests.unit.test_validation:app.
app = App(
    database_url=NOWHERE, redis_url="redis://127.0.0.1:1/0", prefix="hjunit:", max_payload_bytes=64
)


@app.job("resize")
def resize(ctx: JobContext, payload: Resize) -> None: ...


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings read HIVEJOBS_* and DATABASE_URL/REDIS_URL: start every test without them."""
    for key in list(os.environ):
        if key.startswith("HIVEJOBS_") or key in ("DATABASE_URL", "REDIS_URL"):
            monkeypatch.delenv(key)


def fresh_app(**settings: float) -> App:
    return App(
        database_url=NOWHERE,
        redis_url="redis://127.0.0.1:1/0",
        prefix=None,
        testing=None,
        **settings,
    )


# -- job type registration ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "has space", "slash/name", "x" * 65, "ünïcode", "a\nb"])
def test_bad_job_type_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidJobType, match="must be 1-64 letters, digits"):
        fresh_app().job(name)


@pytest.mark.parametrize("name", ["a", "x" * 64, "emails.send", "img-resize_2"])
def test_good_job_type_names_register(name: str) -> None:
    a = fresh_app()
    a.job(name)(resize)
    assert a.types[name].handler is resize


def test_a_name_registers_once() -> None:
    a = fresh_app()
    a.job("resize")(resize)
    with pytest.raises(InvalidJobType, match="registered twice"):
        a.job("resize")


def test_at_most_once_allows_only_one_attempt() -> None:
    a = fresh_app()
    with pytest.raises(InvalidJobType) as info:
        a.job("charge", delivery="at_most_once", attempts=2)
    assert "at_most_once" in str(info.value) and "attempts=2 is impossible" in str(info.value)
    a.job("charge", delivery="at_most_once", attempts=1)(resize)
    a.job("refund", delivery="at_most_once")(resize)
    assert a.types["charge"].attempts == a.types["refund"].attempts == 1


def test_at_least_once_defaults_to_five_attempts() -> None:
    a = fresh_app()
    a.job("resize")(resize)
    assert (a.types["resize"].attempts, a.types["resize"].delivery) == (5, "at_least_once")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"attempts": 0}, "attempts must be at least 1"),
        ({"concurrency": 0}, "concurrency and processes must be at least 1"),
        ({"processes": 0}, "concurrency and processes must be at least 1"),
        ({"timeout": 0}, "timeout must be a positive number"),
        ({"timeout": -1.0}, "timeout must be a positive number"),
        ({"timeout": math.nan}, "timeout must be a positive number"),
        ({"timeout": math.inf}, "timeout must be a positive number"),
        ({"delivery": "exactly_once"}, "delivery must be 'at_least_once' or 'at_most_once'"),
    ],
)
def test_bad_job_type_options_are_refused(options: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidJobType, match=message):
        fresh_app().job("resize", **options)  # type: ignore[arg-type]


def test_job_type_priority_out_of_range_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="priority must be an integer 0-9"):
        fresh_app().job("resize", priority=10)


# -- enqueue options, refused before any connection -------------------------------------


def in_future(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"payload": {"width": "w", "height": 1}},
            PayloadInvalid,
            "Expected `int`, got `str` - at `$.width`",
        ),
        ({"id": "a\x00b"}, InvalidArgument, "contains control characters"),
        ({"id": "line\nbreak"}, InvalidArgument, "contains control characters"),
        ({"id": "x" * 256}, InvalidArgument, "job id must be a string of 1-255 characters"),
        ({"id": ""}, InvalidArgument, "job id must be a string of 1-255 characters"),
        ({"priority": -1}, InvalidArgument, "priority must be an integer 0-9"),
        ({"priority": 1.0}, InvalidArgument, "priority must be an integer 0-9"),
        ({"delay": -0.001}, InvalidArgument, "delay must be between 0 and"),
        ({"delay": math.nan}, InvalidArgument, "delay must be between 0 and"),
        ({"delay": 1, "run_at": in_future(5)}, InvalidArgument, "either delay or run_at"),
        ({"run_at": datetime.now()}, InvalidArgument, "run_at must be timezone-aware"),
        ({"expires_at": in_future(-1)}, InvalidArgument, "expires_at is already in the past"),
    ],
)
def test_bad_enqueue_is_refused_before_connecting(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    kwargs = {"payload": {"width": 1, "height": 2}, **kwargs}
    with pytest.raises(error) as info:
        app.enqueue("resize", **kwargs)  # type: ignore[arg-type]
    assert message in str(info.value)


@pytest.mark.parametrize("job_id", ["job\x9b31m", "job\x85"])
def test_c1_control_characters_in_ids_are_refused(job_id: str) -> None:
    """A CSI (U+009B) in an id reaches terminals through `hivejobs status` and logs."""
    with pytest.raises(InvalidArgument, match="contains control characters"):
        app.enqueue("resize", {"width": 1, "height": 2}, id=job_id)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"delay": "5"},
        {"run_at": "2030-01-01T00:00:00Z"},
        {"expires_at": 1893456000},
    ],
)
def test_wrongly_typed_options_raise_invalid_argument(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        app.enqueue("resize", {"width": 1, "height": 2}, **kwargs)  # type: ignore[arg-type]


def test_oversize_payload_is_refused_before_connecting() -> None:
    with pytest.raises(PayloadTooLarge, match="over the limit of 64 bytes"):
        app.enqueue("resize", {"width": 10**30, "height": 10**30})


def test_enqueue_many_refuses_before_connecting() -> None:
    good = {"width": 1, "height": 2}
    with pytest.raises(PayloadInvalid, match=r"at `\$.height`"):
        app.enqueue_many("resize", [good] * 5 + [{"width": 1, "height": None}] + [good])


# -- Backoff ------------------------------------------------------------------------------


def test_backoff_doubles_per_attempt_within_jitter() -> None:
    backoff = Backoff(base_s=1.0, max_s=600.0)
    for attempt in range(1, 10):
        raw = 2.0 ** (attempt - 1)
        samples = [backoff.delay_s(attempt) for _ in range(200)]
        assert all(0.8 * raw <= s <= 1.2 * raw for s in samples), attempt
        assert max(samples) - min(samples) > 0.1 * raw  # jitter actually spreads retries


def test_backoff_is_capped_before_jitter() -> None:
    backoff = Backoff(base_s=2.0, max_s=10.0)
    samples = [backoff.delay_s(attempt) for attempt in (4, 5, 30, 10_000) for _ in range(100)]
    assert all(8.0 <= s <= 12.0 for s in samples)


# -- config -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://hj:s3cret@db:5432/app", "postgresql://hj:***@db:5432/app"),
        ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
        (
            "postgresql://hj:p%40ss@db/app?sslmode=require",
            "postgresql://hj:***@db/app?sslmode=require",
        ),
        ("postgresql://hj@db/app", "postgresql://hj@db/app"),
        ("postgresql://db/app", "postgresql://db/app"),
    ],
)
def test_redact_url_hides_only_the_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_database_url_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings_from_env().database_url == DEFAULT_DATABASE_URL
    monkeypatch.setenv("DATABASE_URL", "postgresql://plain/db")
    assert settings_from_env().database_url == "postgresql://plain/db"
    monkeypatch.setenv("HIVEJOBS_DATABASE_URL", "postgresql://ours/db")
    assert settings_from_env().database_url == "postgresql://ours/db"
    assert settings_from_env("postgresql://arg/db").database_url == "postgresql://arg/db"


def test_numeric_settings_from_env_and_kwargs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HIVEJOBS_HEARTBEAT_S", "2.5")
    monkeypatch.setenv("HIVEJOBS_MAX_PAYLOAD_BYTES", "2048")
    s = settings_from_env(stuck_after_s=9.0)
    assert (s.heartbeat_s, s.max_payload_bytes, s.stuck_after_s) == (2.5, 2048, 9.0)
    assert settings_from_env(heartbeat_s=1.0).heartbeat_s == 1.0  # kwargs beat the env
    monkeypatch.setenv("HIVEJOBS_HEARTBEAT_S", "often")
    with pytest.raises(ConfigError, match="HIVEJOBS_HEARTBEAT_S='often' must be a finite"):
        settings_from_env()


@pytest.mark.parametrize("prefix", ["has space", "x" * 65, "{tag}", "a/b"])
def test_bad_prefix_is_refused(prefix: str) -> None:
    with pytest.raises(ConfigError, match="redis prefix"):
        settings_from_env(prefix=prefix)


def test_prefix_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings_from_env().prefix == "hivejobs:"
    monkeypatch.setenv("HIVEJOBS_PREFIX", "shop:jobs:")
    assert settings_from_env().prefix == "shop:jobs:"


def test_socket_timeout_must_exceed_pop_block() -> None:
    """A paused Redis must time out a blocking pop, never hang the fetcher for ever (R11)."""
    with pytest.raises(ConfigError, match="redis_socket_timeout_s must exceed pop_block_s"):
        settings_from_env(pop_block_s=5.0, redis_socket_timeout_s=5.0)
    assert settings_from_env(pop_block_s=5.0, redis_socket_timeout_s=5.5).pop_block_s == 5.0


def test_unknown_setting_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        settings_from_env(heartbeat_seconds=1.0)


@pytest.mark.parametrize(
    ("kwargs", "shown"),
    [
        (
            {"database_url": "mysql://root:pw@db/app"},
            "'mysql://root:***@db/app' should start with postgresql://",
        ),
        ({"redis_url": "http://cache:6379"}, "'http://cache:6379' should start with redis://"),
    ],
)
def test_bad_url_scheme_is_a_config_error(kwargs: dict[str, str], shown: str) -> None:
    with pytest.raises(ConfigError) as info:
        App(**kwargs)  # type: ignore[arg-type]
    assert shown in str(info.value)
    assert "pw@" not in str(info.value)


def test_max_payload_bytes_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="max_payload_bytes must be positive"):
        Settings(database_url=DEFAULT_DATABASE_URL, redis_url="redis://x", max_payload_bytes=0)


# -- CLI exit codes -----------------------------------------------------------------------

Cli = Callable[..., tuple[int, str, list[str]]]
APP_SPEC = "tests.unit.test_validation:app"


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Cli:
    """main(argv) -> (exit code, stdout, stderr lines). Logging setup is skipped: it would
    replace the process-wide loguru sinks with one bound to this test's captured stderr."""
    monkeypatch.setattr("hivejobs.logs.setup_logging", lambda *_, **__: None)

    def run(*argv: str) -> tuple[int, str, list[str]]:
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err.splitlines()

    return run


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("frobnicate",), "invalid choice: 'frobnicate'"),
        (("enqueue", "resize"), "the following arguments are required: JSON"),
        (("enqueue", "resize", "{}", "--priority", "high"), "invalid int value: 'high'"),
        (("enqueue", "resize", "{}", "--delay", "soon"), "invalid float value: 'soon'"),
        (("run",), "the following arguments are required: MODULE:APP"),
        (
            ("enqueue", "--app", "tests.unit.no_such_module:app", "resize", "{}"),
            "cannot import 'tests.unit.no_such_module'",
        ),
        (
            ("enqueue", "--app", "tests.unit.test_validation:NOWHERE", "resize", "{}"),
            "NOWHERE is a str, not a hivejobs App",
        ),
    ],
)
def test_cli_bad_arguments_exit_2_with_one_line(
    run_cli: Cli, argv: tuple[str, ...], message: str
) -> None:
    code, out, err = run_cli(*argv)
    assert code == 2
    assert out == ""
    assert len(err) == 1 and err[0].startswith("hivejobs: ") and message in err[0], err


@pytest.mark.parametrize(
    ("payload", "extra", "message"),
    [
        ("{not json", (), "payload for job type 'resize' is invalid: not valid JSON"),
        ('{"width": "w", "height": 1}', (), "Expected `int`, got `str` - at `$.width`"),
        ('{"width": 1, "height": 1}', ("--priority", "12"), "priority must be an integer 0-9"),
        ('{"width": 1, "height": 1}', ("--delay", "-5"), "delay must be between 0 and"),
        ('{"width": 1, "height": 1}', ("--id", "x" * 300), "job id must be a string of 1-255"),
        (f'{{"width": {10**30}, "height": {10**30}}}', (), "over the limit of 64 bytes"),
    ],
)
def test_cli_bad_payload_or_option_exits_2_with_one_line(
    run_cli: Cli, payload: str, extra: tuple[str, ...], message: str
) -> None:
    code, out, err = run_cli("enqueue", "--app", APP_SPEC, "resize", payload, *extra)
    assert code == 2
    assert out == ""
    assert len(err) == 1 and message in err[0], err


def test_cli_unreachable_database_exits_1_and_redacts(run_cli: Cli) -> None:
    """A valid enqueue reaches the store: the server is down, which is not a usage error."""
    code, out, err = run_cli("enqueue", "--app", APP_SPEC, "resize", '{"width":1,"height":1}')
    assert code == 1
    assert len(err) == 1 and "cannot reach Postgres at postgresql://hj:***@127.0.0.1:1" in err[0]
    assert "s3cret" not in err[0]
