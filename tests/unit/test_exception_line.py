"""The exception line of a stored error: what a listing shows of a failure."""

from __future__ import annotations

import traceback

from hivejobs.display import exception_line


def _traceback_of(fn: object) -> str:
    try:
        fn()  # type: ignore[operator]
    except Exception as exc:
        return "".join(traceback.format_exception(exc))
    raise AssertionError("did not raise")


def _bad_address() -> None:
    raise ValueError("no @ in the address")


def _chained() -> None:
    try:
        _bad_address()
    except ValueError as exc:
        raise KeyError("user") from exc


def test_the_line_after_the_frames() -> None:
    assert exception_line(_traceback_of(_bad_address)) == "ValueError: no @ in the address"


def test_a_chained_error_shows_the_last_exception() -> None:
    assert exception_line(_traceback_of(_chained)) == "KeyError: 'user'"


def test_a_tail_cut_inside_the_frames() -> None:
    tail = _traceback_of(_bad_address).split("Traceback (most recent call last):")[1][20:]
    assert exception_line(tail) == "ValueError: no @ in the address"


def test_text_we_wrote_and_nothing() -> None:
    assert exception_line("Fail: the card was declined") == "Fail: the card was declined"
    assert exception_line(None) == ""
    assert exception_line("\n  \n") == ""
