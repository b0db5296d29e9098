"""``{% triage_panel %}``: how much deferred work needs attention, linked to that view.

The app's own index page (``/admin/nexus_workflows/``) shows it. A project puts it on the
admin's front page with a two-line ``templates/admin/index.html``::

    {% extends "admin/index.html" %}
    {% load nexus_workflows_admin %}
    {% block content %}{% triage_panel %}{{ block.super }}{% endblock %}
"""

from __future__ import annotations

import contextlib
from typing import Any

from django import template
from django.template.context import Context
from django.urls import NoReverseMatch, reverse

from nexus_workflows.admin.changelist import NEEDS_ATTENTION
from nexus_workflows.deferred.triage import stale_q
from nexus_workflows.models import DeferredWork, Runner, Status
from nexus_workflows.observability.runners import count_alive

register = template.Library()


@register.inclusion_tag("admin/nexus_workflows/triage_panel.html", takes_context=True)
def triage_panel(context: Context) -> dict[str, Any]:
    request = context.get("request")
    user = getattr(request, "user", None)
    opts = DeferredWork._meta
    if user is None or not (
        user.has_perm(f"{opts.app_label}.view_{opts.model_name}")
        or user.has_perm(f"{opts.app_label}.change_{opts.model_name}")
    ):
        return {"hidden": True}
    try:
        url = reverse(
            f"admin:{opts.app_label}_{opts.model_name}_changelist",
            current_app=getattr(request, "current_app", None),
        )
    except NoReverseMatch:  # the model is not registered with this admin site
        return {"hidden": True}
    current_app = getattr(request, "current_app", None)
    dashboard_url = reverse(f"admin:{opts.app_label}_{opts.model_name}_dashboard", current_app=current_app)
    runner_opts = Runner._meta
    runners_url = ""
    if user.has_perm(f"{runner_opts.app_label}.view_{runner_opts.model_name}"):
        with contextlib.suppress(NoReverseMatch):  # not registered with this admin site
            runners_url = reverse(
                f"admin:{runner_opts.app_label}_{runner_opts.model_name}_changelist", current_app=current_app
            )
    alive, dead = count_alive()
    abandoned = DeferredWork.objects.filter(status=Status.ABANDONED).count()
    stale = DeferredWork.objects.filter(stale_q()).count()
    return {
        "hidden": False,
        "abandoned": abandoned,
        "stale": stale,
        "attention": abandoned + stale,
        "url": f"{url}?status={NEEDS_ATTENTION}",
        "dashboard_url": dashboard_url,
        "runners_url": runners_url,
        "runners_alive": alive,
        "runners_dead": dead,
    }
