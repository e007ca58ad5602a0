"""A decision step posted from a page (approve, reject, revoke, cancel...): one service call
on one object with the form's optional comment, its outcome shown as a message, then back
to the page the form came from (its ``next``, when that is a page of this site)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django import forms
from django.contrib import messages
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.utils.http import url_has_allowed_host_and_scheme

from portal.errors import BusinessError

#: The steps of a page: its name in the URL -> (the service, the word its message ends
#: with), e.g. ``{"approve": (priority_raise_approve, "approved")}``.
Steps = Mapping[str, tuple[Callable[..., Any], str]]


class StepCommentForm(forms.Form):
    """A step's optional comment."""

    comment = forms.CharField(max_length=2000, required=False)


def next_url(request: HttpRequest, default: str) -> str:
    """Where a POST goes back to: the form's ``next`` when it is a page of this site, else
    ``default`` (a URL or a URL name)."""
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return target
    return default


def step_post(
    request: HttpRequest,
    *,
    steps: Steps,
    step: str,
    objects: QuerySet,
    pk: int,
    argument: str,
    noun: str,
    back: str,
) -> HttpResponse:
    """Run ``steps[step]`` as ``service(<argument>=the object, user=, comment=)`` on the
    object ``pk`` of ``objects`` (what the user may see). An unknown step or an object out
    of sight is a 404; the service's refusal is shown as an error message."""
    if step not in steps:
        raise Http404
    target = get_object_or_404(objects, pk=pk)
    service, done = steps[step]
    form = StepCommentForm(request.POST)
    comment = form.cleaned_data["comment"] if form.is_valid() else ""
    try:
        service(**{argument: target}, user=request.user, comment=comment)
        messages.success(request, f"{noun} #{target.pk} {done}.")
    except BusinessError as exc:
        messages.error(request, exc.message)
    return redirect(next_url(request, back))
