"""A decision step posted from a page (approve, reject, revoke, cancel...): one service call
on one object with the form's optional comment, its outcome shown as a message, then back
to the page the form came from (its ``next``, when that is a page of this site)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import messages
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.utils.http import url_has_allowed_host_and_scheme

from portal.errors import BusinessError


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


@dataclass(frozen=True)
class DecisionSteps:
    """The decision steps of one kind of object: ``steps`` maps a step's name in the URL
    to its service and the word its message ends with (``{"approve": (priority_raise_approve,
    "approved")}``); the service is called as ``service(<argument>=the object, user=,
    comment=)``; ``noun`` names the object in the message; ``back`` is the page to return
    to when the form gives no ``next`` of this site."""

    steps: Mapping[str, tuple[Callable[..., Any], str]]
    argument: str
    noun: str
    back: str

    def post(self, request: HttpRequest, *, step: str, objects: QuerySet, pk: int) -> HttpResponse:
        """Take ``step`` on the object ``pk`` of ``objects`` (what the user may see). An
        unknown step or an object out of sight is a 404; the service's refusal is shown as
        an error message."""
        if step not in self.steps:
            raise Http404
        target = get_object_or_404(objects, pk=pk)
        service, done = self.steps[step]
        form = StepCommentForm(request.POST)
        comment = form.cleaned_data["comment"] if form.is_valid() else ""
        try:
            service(**{self.argument: target}, user=request.user, comment=comment)
            messages.success(request, f"{self.noun} #{target.pk} {done}.")
        except BusinessError as exc:
            messages.error(request, exc.message)
        return redirect(next_url(request, self.back))
