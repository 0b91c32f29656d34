"""The other service of the callback test: it receives work from `remote` and `aremote` jobs
(their handler appends "<attempt> <job type> <kind>" to $HJ_LEDGER/handed.<job id>) and
reports each attempt's outcome over HTTP, as rickover's callers do.

The job's payload plans the answers, one per attempt: "succeed", "fail_retry" (failed,
retryable), "fail" (failed for good) or "ignore" (no callback: the timeout must catch it).
Before each answer it also posts a callback for a wrong attempt and records the status (409).
Lines "<attempt> <action> <status of the wrong one> <status of the answer>" go to
answers.<job id>. Runs until terminated.

    python tests/apps/other_service.py URL LEDGER_DIR TOKEN
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx


def main(url: str, folder: Path, token: str) -> None:
    client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    answered: dict[str, int] = {}
    while True:
        for handed in folder.glob("handed.*"):
            job_id = handed.name.split(".", 1)[1]
            lines = [line.split() for line in handed.read_text().splitlines()]
            for attempt, job_type in ((int(p[0]), p[1]) for p in lines if len(p) == 3):
                if attempt <= answered.get(job_id, 0):
                    continue
                answered[job_id] = attempt
                url = f"/v1/jobs/{job_type}/{job_id}"
                plan = client.get(url).json()["payload"]["plan"]
                action = plan[attempt - 1] if attempt <= len(plan) else "succeed"
                wrong = client.post(
                    url,
                    json={"status": "succeeded", "attempt": attempt + 5},
                ).status_code
                status = 0
                if action != "ignore":
                    body = {
                        "status": "succeeded" if action == "succeed" else "failed",
                        "attempt": attempt,
                        "retryable": action == "fail_retry",
                    }
                    status = client.post(url, json=body).status_code
                with open(folder / f"answers.{job_id}", "a") as fh:
                    fh.write(f"{attempt} {action} {wrong} {status}\n")
        time.sleep(0.05)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3])
