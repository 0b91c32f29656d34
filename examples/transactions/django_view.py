"""Enqueue inside Django's `transaction.atomic()` (`pip install 'hivejobs[django]'`).

    DJANGO_SETTINGS_MODULE=examples.transactions.django_settings \
        python -m examples.transactions.django_view

Django's postgresql backend must run on psycopg 3 (Django 4.2+ picks it when installed).
Inside `atomic()` the job commits with the block; outside it Django is in autocommit and the
enqueue is its own transaction.
"""

from __future__ import annotations

import django
from django.db import connection, transaction

from examples.myapp import Resize, app
from hivejobs import JobNotFound


class OrderFailed(Exception):
    pass


def place_order(order_id: str, fail: bool) -> str:
    """A view's body: the job is enqueued in the view's transaction."""
    with transaction.atomic():
        job_id = app.enqueue("resize", Resize(url=f"/{order_id}.png", width=1), conn=connection)
        if fail:
            raise OrderFailed(job_id)
        return job_id


def main() -> None:
    django.setup()
    kept = place_order("order-1", fail=False)
    try:
        place_order("order-2", fail=True)
    except OrderFailed as failed:
        dropped = str(failed)
    try:
        app.get_job(dropped)
    except JobNotFound:
        print(f"committed {kept}: {app.get_job(kept).state}; rolled back {dropped}: not found")
    app.close()


if __name__ == "__main__":
    main()
