"""Text for an operator's terminal: what we did not write is shown escaped, never raw.

Job type names are checked, but chain names, status text, error messages and worker host
names come from users and handlers: an ESC sequence or a newline in them could clear the
screen or forge table rows. Every table and the chain view pass cells through escape().
Never changes stored data, only how it is shown.
"""

from __future__ import annotations

import unicodedata

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
