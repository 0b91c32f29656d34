"""The example app of docs/howto/progress.md: `hivejobs run examples.progress:app`."""

from __future__ import annotations

import time

from hivejobs import App, JobContext

app = App()


@app.job("import_rows")
def import_rows(ctx: JobContext, payload: dict) -> dict:
    rows = [{"id": f"r-{i}"} for i in range(payload["rows"])]
    for i, row in enumerate(rows, 1):
        time.sleep(0.05)  # store(row)
        ctx.progress(i, len(rows), note=f"row {i}")  # cheap: call it as often as you like
        if i % 2 == 0:
            ctx.emit({"imported": i, "last_id": row["id"]})  # a partial result
    return {"imported": len(rows)}
