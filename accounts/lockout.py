"""The failed sign-in lockout (django-axes): its message, its response, its audit row.

Axes counts failed sign-ins per username in its database table and refuses the account
for ``SLUICE_LOGIN_COOLOFF_MINUTES`` after ``SLUICE_LOGIN_FAILURE_LIMIT`` failures, also
with the right password. This module words the refusal the same way on the login form,
the admin login and the API, and audits each lockout once.
"""

from __future__ import annotations

import math
from datetime import datetime

from axes.helpers import get_client_username, get_cool_off
from axes.models import AccessAttempt
from django.db.models import Max
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone

from portal.middleware import client_address

from . import services


def lockout_ends_at(username: str | None) -> datetime | None:
    """When the account's lockout ends: the cool-off after its last counted failure."""
    cool_off = get_cool_off()
    if not username or cool_off is None:
        return None
    last = AccessAttempt.objects.filter(username=username).aggregate(last=Max("attempt_time"))
    return last["last"] + cool_off if last["last"] else None


def lockout_retry_after(username: str | None) -> int | None:
    """Seconds until the lockout ends (a 429's ``Retry-After``); None without a cool-off."""
    ends = lockout_ends_at(username)
    if ends is None:
        return None
    return max(1, math.ceil((ends - timezone.now()).total_seconds()))


def lockout_message(username: str | None) -> str:
    ends = lockout_ends_at(username)
    if ends is None:
        return "Too many failed sign-ins for this account; ask a platform admin to unlock it."
    minutes = max(1, math.ceil((ends - timezone.now()).total_seconds() / 60))
    unit = "minute" if minutes == 1 else "minutes"
    return f"Too many failed sign-ins for this account; try again in {minutes} {unit}."


def client_ip_address(request) -> str | None:
    """``AXES_CLIENT_IP_CALLABLE``: the address the audit log records for this request."""
    return client_address(request)


def is_locked_out(request) -> bool:
    """Whether axes refused (or just locked) the sign-in made with this request."""
    return bool(getattr(request, "axes_locked_out", False))


def lockout_response(
    request: HttpRequest, original_response: HttpResponse | None = None, credentials=None
) -> HttpResponse:
    """``AXES_LOCKOUT_CALLABLE``: 429 with the message, in the API's error shape under
    ``/api/``; on pages the login form as rendered (it shows the message itself, see
    ``forms.LockoutAwareLoginMixin``), with status 429."""
    username = get_client_username(request, credentials)
    message = lockout_message(username)
    if request.path.startswith("/api/"):
        response = JsonResponse({"detail": message, "errors": {}}, status=429)
    elif original_response is not None and original_response.status_code == 200:
        original_response.status_code = 429
        response = original_response
    else:
        response = HttpResponse(message, status=429, content_type="text/plain; charset=utf-8")
    wait = lockout_retry_after(username)
    if wait is not None:
        response["Retry-After"] = str(wait)
    return response


def on_user_locked_out(sender, request=None, username=None, **kwargs) -> None:
    """Receiver of axes' ``user_locked_out``: audit the failure that locked the account.

    Axes also sends the signal for each attempt refused while locked; those have no new
    failure count (``axes_failures_since_start`` is None) and are not audited, or a locked
    account could be used to flood the audit log.
    """
    failures = getattr(request, "axes_failures_since_start", None)
    if failures is None or not username:
        return
    services.sign_in_lockout_record(
        username=username, failures=failures, locked_until=lockout_ends_at(username)
    )
