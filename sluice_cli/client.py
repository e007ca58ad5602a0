"""HTTP to Sluice's REST API with the standard library (fast to import, nothing to install).

Every failure becomes an :class:`ApiError` that carries the exit code scripts rely on (see
``EXIT_CODES`` in main.py): 1 the API refused (4xx), 3 not found (404), 4 no or bad
credentials (401), 5 server or network error.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

from . import __version__

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_AUTH = 4
EXIT_SERVER = 5

MAX_PAGE_SIZE = 500  # the API's largest page (portal.api.pagination)


class CliError(Exception):
    """Something to tell the user on stderr, and the exit code to leave with."""

    def __init__(self, message: str, exit_code: int, body: Any = None):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.body = body  # the API's error JSON, when there is one


class ApiError(CliError):
    def __init__(self, message: str, exit_code: int, status: int | None, body: Any = None):
        super().__init__(message, exit_code, body)
        self.status = status


def exit_code_for(status: int) -> int:
    if status == 401:
        return EXIT_AUTH
    if status == 404:
        return EXIT_NOT_FOUND
    if 400 <= status < 500:
        return EXIT_REFUSED
    return EXIT_SERVER


def error_lines(body: Any) -> list[str]:
    """``{"detail": ..., "errors": {field: [messages]}}`` → one line per field message,
    ``field: message``; the detail alone when no field is named."""
    if not isinstance(body, dict):
        return []
    errors = body.get("errors") or {}
    lines = []
    if isinstance(errors, dict):
        for field, messages in errors.items():
            for message in messages if isinstance(messages, list) else [messages]:
                lines.append(message if field == "non_field_errors" else f"{field}: {message}")
    detail = str(body.get("detail") or "")
    # "Invalid input: field: message" repeats the first field message; a business error's
    # detail often repeats its field's message too.
    repeated = (detail.startswith("Invalid input") and lines) or any(
        line.endswith(detail) for line in lines
    )
    if detail and not repeated:
        lines.insert(0, detail)
    return lines


class Client:
    """One server, one token. ``path`` is relative to ``/api/v1/``."""

    def __init__(self, url: str, token: str | None, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        auth: bool = True,
    ) -> Any:
        url = f"{self.url}/api/v1/{path.strip('/')}"
        if params:
            query = {k: v for k, v in params.items() if v is not None and v != []}
            url += "?" + urllib.parse.urlencode(query, doseq=True)
        request = urllib.request.Request(url, method=method)
        request.add_header("Accept", "application/json")
        request.add_header("User-Agent", f"sluice-cli/{__version__}")
        if auth:
            if not self.token:
                # "not logged in" would send the user to `sluice login`, which cannot help
                # while the server does not answer: say that first.
                self.check_reachable()
                raise CliError("not logged in: run `sluice login`, or set SLUICE_TOKEN", EXIT_AUTH)
            request.add_header("Authorization", f"Token {self.token}")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, data=data, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc, method, path) from None
        except (TimeoutError, urllib.error.URLError, OSError) as exc:
            raise self._unreachable(exc) from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(
                f"{method} {url} answered something that is not JSON (is {self.url} a Sluice "
                "portal?)",
                EXIT_SERVER,
                None,
            ) from None

    def _unreachable(self, exc: BaseException) -> ApiError:
        reason = getattr(exc, "reason", exc)
        return ApiError(f"cannot reach {self.url}: {reason}", EXIT_SERVER, None)

    def check_reachable(self) -> None:
        """Raise ``cannot reach`` (exit 5) unless the server answers at all: any HTTP
        status will do, nothing is sent but a GET of the API's root."""
        request = urllib.request.Request(f"{self.url}/api/v1/", method="GET")
        request.add_header("User-Agent", f"sluice-cli/{__version__}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                response.read(0)
        except urllib.error.HTTPError:
            return
        except (TimeoutError, urllib.error.URLError, OSError) as exc:
            raise self._unreachable(exc) from None

    def _http_error(self, exc: urllib.error.HTTPError, method: str, path: str) -> ApiError:
        status = exc.code
        try:
            body = json.loads(exc.read() or b"null")
        except ValueError:
            body = None
        lines = error_lines(body)
        if status == 401:
            why = lines[0] if lines else "no valid credentials"
            message = f"{why} (run `sluice login`, or set SLUICE_TOKEN)"
        elif status >= 500 or not lines:
            message = f"{method} /api/v1/{path.strip('/')}: HTTP {status}"
            if lines:
                message += ": " + "; ".join(lines)
        else:
            message = "\n".join(lines)
        return ApiError(message, exit_code_for(status), status, body)

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return self.request("POST", path, body=body if body is not None else {}, **kwargs)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def paginate(self, path: str, limit: int | None = None, **params: Any) -> Iterator[dict]:
        """Rows of a paginated list, page after page, at most ``limit`` of them."""
        size = MAX_PAGE_SIZE if limit is None else max(1, min(limit, MAX_PAGE_SIZE))
        page, seen = 1, 0
        while True:
            data = self.get(path, page=page, page_size=size, **params)
            rows = data.get("results", []) if isinstance(data, dict) else data
            for row in rows:
                yield row
                seen += 1
                if limit is not None and seen >= limit:
                    return
            if not isinstance(data, dict) or not data.get("next"):
                return
            page += 1
