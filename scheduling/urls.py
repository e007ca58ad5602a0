from django.urls import path

from . import views

urlpatterns = [
    path("jobs/", views.job_list, name="job-list"),
    path("jobs/new/", views.job_submit, name="job-submit"),
    path("jobs/new/preview", views.job_submit_preview, name="job-submit-preview"),
    path("jobs/bulk", views.job_bulk, name="job-bulk"),
    path("jobs/<int:pk>/", views.job_detail, name="job-detail"),
    path("jobs/<int:pk>/live", views.job_live, name="job-live"),
    path("jobs/<int:pk>/log", views.job_log, name="job-log"),
    path("jobs/<int:pk>/<slug:step>", views.job_action, name="job-action"),
    path("queues/", views.queue_list, name="queue-list"),
    path("queues/<int:pk>/", views.queue_detail, name="queue-detail"),
    path("quotas/", views.quota_index, name="quota-index"),
    path("quotas/<slug:slug>/", views.quota_page, name="quota"),
    path("nodes/", views.node_list, name="node-list"),
    path("nodes/<int:pk>/remove", views.node_remove, name="node-remove"),
    path("jobs/<int:pk>/raise/", views.raise_request, name="raise-request"),
    path("approvals/", views.approvals, name="approvals"),
    path("raises/<int:pk>/<slug:step>", views.raise_action, name="raise-action"),
    path("notifications/", views.notification_list, name="notification-list"),
    path("notifications/<int:pk>/read", views.notification_read, name="notification-read"),
    path("notifications/read-all", views.notifications_read_all, name="notifications-read-all"),
]

# What-if simulator (platform admins): scheduling.views_simulator
from . import views_simulator  # noqa: E402

urlpatterns += [
    path("simulate/", views_simulator.simulate_index, name="simulate"),
    path("simulate/<int:pk>/", views_simulator.simulate_run, name="simulate-run"),
    path(
        "simulate/<int:pk>/status", views_simulator.simulate_run_status, name="simulate-run-status"
    ),
]
