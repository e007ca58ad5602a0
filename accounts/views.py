from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render

from portal.errors import BusinessError, NotFoundError
from portal.forms import add_business_error

from . import selectors, services
from .forms import ApiTokenCreateForm


@login_required
def token_list(request):
    """Your API tokens; make one (its key is shown on this answer only) or revoke one."""
    form = ApiTokenCreateForm(request.POST or None)
    created = None
    if request.method == "POST" and form.is_valid():
        try:
            token, key = services.api_token_create(user=request.user, **form.cleaned_data)
            created = {"token": token, "key": key}
            form = ApiTokenCreateForm()
        except BusinessError as exc:
            add_business_error(form, exc)
    context = {
        "tokens": selectors.api_tokens_of(request.user),
        "form": form,
        "created": created,
    }
    response = render(request, "accounts/token_list.html", context)
    if created:
        # The key is in this page: no cache may keep it.
        response["Cache-Control"] = "no-store"
    return response


@login_required
def token_revoke(request, pk):
    """Revoke a token, after a confirmation page (GET asks, POST revokes)."""
    try:
        token = selectors.api_token_get(request.user, pk)
    except NotFoundError:
        raise Http404("API token not found") from None
    if request.method == "POST":
        services.api_token_revoke(actor=request.user, token=token)
        messages.success(request, f"Token “{token.name}” ({token.prefix}…) revoked.")
        return redirect("account-tokens")
    return render(request, "accounts/token_revoke.html", {"token": token})
