"""The check every request passes after routing, before its handler: no NUL character in a
path or query parameter. Postgres text cannot hold one, so a NUL in `?type=`, an `after`
cursor or a job type in the path reached the driver and came back as a 500 with a traceback
in the log per request; here it is a 422 naming the parameter, and nothing is logged."""

from __future__ import annotations

from typing import Any

from litestar import Request

from hivejobs.errors import InvalidArgument


def refuse_nul(request: Request[Any, Any, Any]) -> None:
    params: list[tuple[str, str, object]] = [
        ("path parameter", key, value) for key, value in request.path_params.items()
    ]
    params += [("query parameter", k, v) for k, v in request.query_params.multi_items()]
    for kind, key, value in params:
        if "\x00" in key or (isinstance(value, str) and "\x00" in value):
            raise InvalidArgument(f"{kind} {key!r} must not contain NUL characters (%00)")
