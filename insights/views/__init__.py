"""The insights' pages, one module per part: the insights page (``overview``), ``/metrics``
(``metrics``), usage accounting (``usage``), the recommendations (``recommendations``) and
the weekly policy review (``reviews``). The views are exported here for ``insights.urls``."""

from .metrics import prometheus_metrics
from .overview import insights
from .recommendations import (
    recommendation_apply,
    recommendation_detail,
    recommendation_dismiss,
    recommendation_list,
    recommendation_simulate,
    recommendations_run_now,
)
from .reviews import policy_review, policy_review_compute, policy_reviews
from .usage import usage_page

__all__ = [
    "insights",
    "policy_review",
    "policy_review_compute",
    "policy_reviews",
    "prometheus_metrics",
    "recommendation_apply",
    "recommendation_detail",
    "recommendation_dismiss",
    "recommendation_list",
    "recommendation_simulate",
    "recommendations_run_now",
    "usage_page",
]
