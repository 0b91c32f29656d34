"""Enqueue from Django, as a view would: `python -m tests.apps.django_enqueue`.

Runs in a process of its own (Django's settings are set once per process), with
DJANGO_SETTINGS_MODULE=examples.transactions.django_settings and the fleet's HIVEJOBS_* environment.
Prints one JSON object: the ids that were committed and those that were rolled back.
"""

from __future__ import annotations

import json

import django
from django.db import connection, transaction

from hivejobs import App


class Abort(Exception):
    """Raised inside atomic() to roll it back, as a failing view would."""


def main() -> None:
    django.setup()
    app = App()  # URLs and prefix from the environment
    committed: list[str] = []
    rolled_back: list[str] = []

    with transaction.atomic():  # the enqueue is the first statement of the transaction
        committed.append(app.enqueue("alo", {"ms": 1}, conn=connection))
    with transaction.atomic():  # after other statements
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        committed.append(app.enqueue("alo", {"ms": 1}, conn=connection))
    try:
        with transaction.atomic():
            rolled_back.append(app.enqueue("alo", {"ms": 1}, conn=connection))
            raise Abort()
    except Abort:
        pass
    with transaction.atomic():  # a savepoint (nested atomic) rolled back, the outer committed
        committed.append(app.enqueue("alo", {"ms": 1}, conn=connection))
        try:
            with transaction.atomic():
                rolled_back.append(app.enqueue("alo", {"ms": 1}, conn=connection))
                raise Abort()
        except Abort:
            pass
    # Outside atomic() Django's connection is in autocommit: the enqueue is its own transaction.
    committed.append(app.enqueue("alo", {"ms": 1}, conn=connection))
    app.close()
    print(json.dumps({"committed": committed, "rolled_back": rolled_back}))


if __name__ == "__main__":
    main()
