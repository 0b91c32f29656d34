"""Text for an operator's terminal: what we did not write is shown escaped, never raw.

Job type names are checked, but chain names, status text, error messages and worker host
names come from users and handlers: an ESC sequence or a newline in them could clear the
screen or forge table rows. Every table and the chain view pass cells through escape().
Never changes stored data, only how it is shown.
"""

from __future__ import annotations

import unicodedata

from hivejobs.records.events import JobEvent

# Controls (ESC, newline, DEL...), format characters (RTL override, zero-width), line and
# paragraph separators, and lone surrogates (undecodable bytes).
_ESCAPED = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def escape(value: object) -> str:
    """str(value) with every control, format or separator character as a JSON-style \\uXXXX
    escape (so JSON output stays valid JSON); printable text is left alone."""
    text = str(value)
    if text.isprintable():  # the common case: nothing to escape (space is printable)
        return text
    out = []
    for ch in text:
        if unicodedata.category(ch) not in _ESCAPED:
            out.append(ch)
        elif ord(ch) > 0xFFFF:  # as a UTF-16 pair, as JSON spells it
            code = ord(ch) - 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            out.append(f"\\u{ord(ch):04x}")
    return "".join(out)


_TRACEBACK_HEAD = "Traceback (most recent call last):"


def exception_line(error: str | None) -> str:
    """The line that says what went wrong (`ValueError: no @ in the address`) out of a stored
    error: a traceback puts it after its frames, at the left margin; an error we wrote
    (`Fail: ...`, a timeout) is one line already. Works on the tail of a long traceback too,
    which is all a listing reads."""
    lines = [line for line in (error or "").splitlines() if line.strip()]
    if not lines:
        return ""
    heads = [i for i, line in enumerate(lines) if line.startswith(_TRACEBACK_HEAD)]
    if heads:
        # The last traceback is the one that ended the attempt (an earlier one is its cause);
        # its first line at the margin after the frames is the exception.
        for line in lines[heads[-1] + 1 :]:
            if not line[0].isspace():
                return line
    # A tail cut inside a traceback, or text we wrote: the first margin line after the last
    # indented one (a frame or a caret line), else the first line.
    indented = [i for i, line in enumerate(lines) if line[0].isspace()]
    if indented and indented[-1] + 1 < len(lines):
        return lines[indented[-1] + 1]
    return lines[0]


def progress_text(event: JobEvent) -> str:
    """A progress report in words, as the CLI and the dashboard show it (unescaped):
    "3/10 (30%) copying", or "3" without a total."""
    done = f"{event.done or 0:g}"
    text = done if event.total is None else f"{done}/{event.total:g}"
    if event.total:
        text += f" ({100 * (event.done or 0) / event.total:.0f}%)"
    return text + (f" {event.note}" if event.note else "")
