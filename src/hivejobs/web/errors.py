"""Every error the API answers, as one JSON shape (ErrorOut) with the status that says what
went wrong: 400 malformed JSON, 401/403 auth, 404 unknown type or id, 409 conflicts, 413
oversize, 422 invalid options or payload, 503 Postgres/Redis down. Nothing is stored on any of
them: every check runs before the first write (App's rule)."""

from __future__ import annotations

from typing import Any

import msgspec
import psycopg
import redis
from litestar import Request, Response
from litestar.exceptions import ClientException, HTTPException, ValidationException
from litestar.openapi.datastructures import ResponseSpec
from litestar.response import Redirect
from loguru import logger

from hivejobs.errors import ConnectionFailed, ErrorKind, HivejobsError
from hivejobs.logs import error_fields
from hivejobs.serialization import TOO_DEEP
from hivejobs.web.schemas import ErrorOut

# Each kind of error (errors.ErrorKind) as the status that says it; "usage" and "failed"
# answer 400.
STATUS_OF: dict[ErrorKind, int] = {
    "invalid": 422,
    "unknown_type": 404,
    "too_large": 413,
    "id_conflict": 409,
    "not_found": 404,
    "state_conflict": 409,
    "unavailable": 503,
}
DESCRIPTIONS = {
    200: "the existing job (same id, same type and payload)",
    201: "stored now",
    400: "malformed JSON",
    401: "no valid token",
    403: "a read-only token cannot change anything",
    404: "unknown job type, job, chain or batch",
    409: "conflict with the job's current state or payload",
    413: "body over the size limit",
    422: "invalid options or payload; `details` names the fields",
    503: "Postgres or Redis does not answer",
}


def ERROR_RESPONSES(  # reads as a table
    *codes: int, health: bool = False
) -> dict[int, ResponseSpec]:
    """OpenAPI entries for the errors a route can answer (401/403 go with every route)."""
    from hivejobs.web.schemas import JobOut

    out: dict[int, ResponseSpec] = {}
    for code in sorted({*codes, 400, 401, 403, 422, 503}):
        model: Any = JobOut if code in (200, 201) else ErrorOut
        if code == 503 and health:
            from hivejobs.web.schemas import Health

            model = Health
        out[code] = ResponseSpec(data_container=model, description=DESCRIPTIONS[code])
    return out


def _json(status: int, message: str, details: list[dict[str, Any]] | None = None) -> Response[Any]:
    body = msgspec.json.encode(ErrorOut(error=message, status=status, details=details))
    return Response(body, status_code=status, media_type="application/json")


def on_hivejobs_error(_: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    if isinstance(exc, ConnectionFailed):
        # The message names the server (user, host, port, database): for our log, not for
        # every HTTP client.
        logger.warning("request failed: backend down", service=exc.service, error=str(exc))
        return _json(503, f"{exc.service} does not answer; retry later")
    assert isinstance(exc, HivejobsError)
    return _json(STATUS_OF.get(exc.kind, 400), str(exc))


def on_validation(_: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Litestar's 400 for a body or parameter: malformed JSON stays 400; JSON that does not
    fit the schema (wrong type, out of range, unknown field) is 422 with the fields named."""
    assert isinstance(exc, ValidationException)
    extra = exc.extra if isinstance(exc.extra, list) else None
    if extra:
        parts = [f"{e.get('key')}: {e.get('message')}" for e in extra if isinstance(e, dict)]
        return _json(422, "invalid request: " + "; ".join(parts), extra)
    detail = str(exc.detail)
    if "malformed" not in detail.lower():
        detail = f"request body is not valid JSON (JSON is malformed: {detail})"
    return _json(400, detail)


def _base(request: Request[Any, Any, Any]) -> str:
    root = str(request.scope.get("root_path", "")) or str(request.app.state.base_path)
    return root.rstrip("/")


def _wants_page(request: Request[Any, Any, Any]) -> bool:
    """A browser opening a dashboard page: it asks for HTML and cannot send a bearer header,
    so a 401 would leave it on a JSON dead end. The pages' own live fetches ask for any type
    and keep the JSON answer."""
    path = request.url.path.removeprefix(_base(request))
    dashboard = path in ("", "/") or (
        path.startswith("/dashboard") and not path.startswith("/dashboard/login")
    )
    return (
        request.method == "GET" and dashboard and "text/html" in request.headers.get("accept", "")
    )


def on_http(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 401 and _wants_page(request):
        return Redirect(_base(request) + "/dashboard/login", status_code=303)
    if exc.status_code == 413:
        return _json(413, "request body over the size limit (see --max-body-bytes)")
    if type(exc) is ClientException and exc.status_code == 400:
        # Litestar raises a bare ClientException when the body does not decode.
        return _json(400, f"request body is not valid JSON (malformed: {exc.detail})")
    response = _json(exc.status_code, str(exc.detail))
    if exc.headers:
        response.headers.update(exc.headers)
    return response


def on_backend_down(_: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Postgres or Redis did not answer: the request may be retried; nothing is half-done
    that a retry could not fix (enqueue with your id is idempotent)."""
    service = "Redis" if isinstance(exc, redis.RedisError) else "Postgres"
    logger.warning("request failed: backend down", service=service, **error_fields(exc))
    return _json(503, f"{service} does not answer; retry later")


def on_too_deep(_: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """A body nested deeper than the decoder walks (its recursion limit): the client's error,
    answered without a traceback in the log."""
    return _json(400, f"request body is {TOO_DEEP}")


def on_unexpected(_: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    logger.opt(exception=exc).error("request failed unexpectedly")
    return _json(500, "internal error: see the server's log")


HANDLERS: dict[int | type[Exception], Any] = {
    HivejobsError: on_hivejobs_error,
    ValidationException: on_validation,
    HTTPException: on_http,
    psycopg.OperationalError: on_backend_down,
    redis.RedisError: on_backend_down,
    RecursionError: on_too_deep,
    Exception: on_unexpected,
}
