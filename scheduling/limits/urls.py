from django.urls import path

from . import views

urlpatterns = [
    path("jobs/<int:pk>/extensions/", views.extension_request, name="job-extension-request"),
    path("jobs/<int:pk>/idle-exemption/", views.job_idle_exempt, name="job-idle-exempt"),
    path("approvals/extensions/", views.extension_approvals, name="extension-approvals"),
    path(
        "runtime-extensions/<int:pk>/<slug:step>",
        views.extension_action,
        name="extension-action",
    ),
    path("recovery/", views.recovery, name="recovery"),
]
