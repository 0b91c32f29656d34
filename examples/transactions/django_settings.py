"""The smallest Django settings for examples.transactions.django_view: the same database as
hivejobs (HIVEJOBS_DATABASE_URL, else the local default)."""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict

from hivejobs.config import DEFAULT_DATABASE_URL

_db = conninfo_to_dict(os.environ.get("HIVEJOBS_DATABASE_URL", DEFAULT_DATABASE_URL))
SECRET_KEY = "example-only"
USE_TZ = True
INSTALLED_APPS: list[str] = []
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname", ""),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
    }
}
