"""One Python interpreter for a docs page's ```python blocks, run in a namespace they share,
as a reader pasting them one after the other into one session would: a later block may use
what an earlier one defined.

Protocol (tests/docs/test_docs_blocks.py): one file name per stdin line; after running it,
one JSON line on stdout, {"ok": bool, "output": what the block printed, or its traceback}.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback
from pathlib import Path


def main() -> None:
    answers = sys.stdout
    namespace: dict[str, object] = {"__name__": "__main__"}
    for line in sys.stdin:
        path = Path(line.strip())
        printed = io.StringIO()
        ok = True
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            try:
                exec(compile(path.read_text(), str(path), "exec"), namespace)
            except BaseException:  # SystemExit and KeyboardInterrupt too: a block's failure
                ok = False
                traceback.print_exc()
        answers.write(json.dumps({"ok": ok, "output": printed.getvalue()}) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
