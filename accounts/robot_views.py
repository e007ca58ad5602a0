"""The robot accounts page of a tenant: ``/tenants/<slug>/robots/``."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from portal.errors import BusinessError, NotFoundError, PermissionDeniedError
from portal.forms import add_business_error
from tenants.choices import Role
from tenants.selectors import has_role, tenant_get

from . import robots
from .forms import ApiTokenCreateForm, RobotCreateForm


def _tenant(user, slug):
    try:
        return tenant_get(user, slug)
    except NotFoundError:
        raise Http404("Tenant not found") from None


def _robot(user, tenant, name):
    try:
        return robots.robot_get(user, tenant, name)
    except NotFoundError:
        raise Http404("Robot account not found") from None


def _require_admin(user, tenant):
    if not has_role(user, tenant, Role.ADMIN):
        raise PermissionDenied("Only the tenant's admins manage its robot accounts.")


def _page(request, tenant, *, form=None, token_forms=None, created=None, status=200):
    is_admin = has_role(request.user, tenant, Role.ADMIN)
    rows = []
    for robot in robots.robots_of_tenant(request.user, tenant).order_by("name"):
        token_form = (token_forms or {}).get(robot.name) or ApiTokenCreateForm(
            prefix=f"t-{robot.name}"
        )
        rows.append(
            {
                "robot": robot,
                "tokens": list(robots.robot_tokens(request.user, robot)),
                "token_form": token_form,
            }
        )
    context = {
        "tenant": tenant,
        "is_admin": is_admin,
        "rows": rows,
        "form": form or (RobotCreateForm() if is_admin else None),
        "created": created,
    }
    response = render(request, "accounts/robot_list.html", context, status=status)
    if created:
        response["Cache-Control"] = "no-store"  # the new key is in this page
    return response


@login_required
def robot_list(request, slug):
    """The tenant's robots and their tokens; its admins make robots here."""
    tenant = _tenant(request.user, slug)
    if request.method != "POST":
        return _page(request, tenant)
    _require_admin(request.user, tenant)
    form = RobotCreateForm(request.POST)
    if form.is_valid():
        try:
            robot = robots.robot_create(actor=request.user, tenant=tenant, **form.cleaned_data)
        except (BusinessError, PermissionDeniedError) as exc:
            add_business_error(form, exc)
        else:
            messages.success(request, f"Robot {robot.user.username} made; now make it a token.")
            return redirect("tenant-robots-page", slug=tenant.slug)
    return _page(request, tenant, form=form, status=400)


@login_required
@require_POST
def robot_token_create(request, slug, name):
    """Make a token for a robot; the key is shown on this answer only."""
    tenant = _tenant(request.user, slug)
    robot = _robot(request.user, tenant, name)
    _require_admin(request.user, tenant)
    form = ApiTokenCreateForm(request.POST)
    if not form.is_valid():
        form = ApiTokenCreateForm(request.POST, prefix=f"t-{name}")
    if form.is_valid():
        try:
            token, key = robots.robot_token_create(
                actor=request.user, robot=robot, **form.cleaned_data
            )
        except BusinessError as exc:
            add_business_error(form, exc)
        else:
            return _page(request, tenant, created={"robot": robot, "token": token, "key": key})
    return _page(request, tenant, token_forms={name: form}, status=400)


@login_required
@require_POST
def robot_token_revoke(request, slug, name, pk):
    tenant = _tenant(request.user, slug)
    robot = _robot(request.user, tenant, name)
    _require_admin(request.user, tenant)
    try:
        token = robots.robot_token_get(request.user, robot, pk)
    except NotFoundError:
        raise Http404("API token not found") from None
    robots.robot_token_revoke(actor=request.user, robot=robot, token=token)
    messages.success(request, f"Token “{token.name}” of {robot.user.username} revoked.")
    return redirect("tenant-robots-page", slug=tenant.slug)


@login_required
@require_POST
def robot_delete(request, slug, name):
    tenant = _tenant(request.user, slug)
    robot = _robot(request.user, tenant, name)
    _require_admin(request.user, tenant)
    robots.robot_delete(actor=request.user, robot=robot)
    messages.success(request, f"Robot {robot.user.username} deleted; its tokens are revoked.")
    return redirect("tenant-robots-page", slug=tenant.slug)
