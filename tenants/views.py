from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from portal.errors import BusinessError, NotFoundError
from portal.forms import add_business_error

from . import selectors, services
from .choices import MembershipSource, Role
from .forms import MemberAddForm, MemberRoleForm, ProjectForm

User = get_user_model()


def _tenant_or_404(user, slug):
    try:
        return selectors.tenant_get(user, slug)
    except NotFoundError:
        raise Http404("Tenant not found") from None


@login_required
def tenant_list(request):
    tenants = selectors.tenants_visible_to(request.user).prefetch_related("projects")
    return render(request, "tenants/tenant_list.html", {"tenants": tenants})


@login_required
def tenant_detail(request, slug):
    tenant = _tenant_or_404(request.user, slug)
    is_admin = selectors.has_role(request.user, tenant, Role.ADMIN)
    add_form = MemberAddForm(request.POST or None, prefix="add") if is_admin else None
    project_form = ProjectForm(prefix="project")
    adding = request.method == "POST" and add_form is not None and "add-username" in request.POST
    if adding and add_form.is_valid():
        user = User.objects.filter(username=add_form.cleaned_data["username"]).first()
        if user is None:
            add_form.add_error("username", "No user with this username.")
        else:
            try:
                services.membership_add(
                    actor=request.user, tenant=tenant, user=user, role=add_form.cleaned_data["role"]
                )
                messages.success(
                    request, f"{user.username} added as {add_form.cleaned_data['role']}."
                )
                return redirect("tenant-detail", slug=tenant.slug)
            except BusinessError as exc:
                add_business_error(add_form, exc)
    memberships = list(selectors.memberships_of_tenant(request.user, tenant))
    for m in memberships:
        m.is_robot = hasattr(m.user, "robot")  # read with the membership: no query
    context = {
        "tenant": tenant,
        "is_admin": is_admin,
        "my_role": selectors.role_in(request.user, tenant)
        or ("platform admin" if selectors.is_platform_admin(request.user) else None),
        "memberships": memberships,
        "has_directory_members": any(m.source == MembershipSource.DIRECTORY for m in memberships),
        "projects": tenant.projects.all(),
        "add_form": add_form,
        "project_form": project_form,
        "roles": Role.choices,
    }
    return render(request, "tenants/tenant_detail.html", context)


@login_required
@require_POST
def member_role(request, slug, username):
    tenant = _tenant_or_404(request.user, slug)
    membership = get_object_or_404(
        selectors.memberships_of_tenant(request.user, tenant), user__username=username
    )
    form = MemberRoleForm(request.POST)
    try:
        if not form.is_valid():
            raise BusinessError("Choose a valid role.", field="role")
        services.membership_change_role(
            actor=request.user, membership=membership, role=form.cleaned_data["role"]
        )
        messages.success(request, f"{username} is now {form.cleaned_data['role']}.")
    except BusinessError as exc:
        messages.error(request, exc.message)
    return redirect("tenant-detail", slug=tenant.slug)


@login_required
@require_POST
def member_remove(request, slug, username):
    tenant = _tenant_or_404(request.user, slug)
    membership = get_object_or_404(
        selectors.memberships_of_tenant(request.user, tenant), user__username=username
    )
    try:
        services.membership_remove(actor=request.user, membership=membership)
        messages.success(request, f"{username} removed from {tenant.slug}.")
    except BusinessError as exc:
        messages.error(request, exc.message)
    return redirect("tenant-detail", slug=tenant.slug)


@login_required
@require_POST
def project_create(request, slug):
    tenant = _tenant_or_404(request.user, slug)
    form = ProjectForm(request.POST, prefix="project")
    if form.is_valid():
        try:
            project = services.project_create(
                actor=request.user, tenant=tenant, **form.cleaned_data
            )
            messages.success(request, f"Project {project} created.")
            return redirect("project-detail", pk=project.pk)
        except BusinessError as exc:
            add_business_error(form, exc)
    for field, errors in form.errors.items():
        for error in errors:
            messages.error(request, f"{field}: {error}" if field != "__all__" else error)
    return redirect("tenant-detail", slug=tenant.slug)


@login_required
def project_list(request):
    projects = selectors.projects_visible_to(request.user)
    return render(request, "tenants/project_list.html", {"projects": projects})


@login_required
def project_detail(request, pk):
    project = get_object_or_404(selectors.projects_visible_to(request.user), pk=pk)
    return render(
        request,
        "tenants/project_detail.html",
        {
            "project": project,
            "can_submit": selectors.can_submit_to_project(request.user, project),
            "is_admin": selectors.has_role(request.user, project.tenant, Role.ADMIN),
        },
    )
