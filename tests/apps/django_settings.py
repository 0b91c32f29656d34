"""A minimal Django settings module: its postgresql backend (psycopg 3) on the test database.

The database comes from HIVEJOBS_DATABASE_URL, as for every other test process."""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ["HIVEJOBS_DATABASE_URL"])

SECRET_KEY = "tests-only"
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
