"""Views a project may put in its URLs.

``metrics`` serves the database's figures in Prometheus' text format: rows per kind and
status, the oldest due age per kind, runners alive and dead. It carries kinds, statuses
and counts only, but protect it like the project's other internals (an internal-only
route, the reverse proxy's allow-list, or a wrapper that checks a token)::

    from nexus_workflows.views import metrics

    urlpatterns = [path("internal/metrics", metrics)]

Each runner's own counters are on its ``runworkflows --metrics-port`` endpoint.
"""

from __future__ import annotations

from django.db import Error as DatabaseError  # InterfaceError included
from django.db import router
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from nexus_workflows.models import DeferredWork
from nexus_workflows.observability.metrics import database_registry


@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    registry = database_registry(router.db_for_read(DeferredWork))
    try:
        body = generate_latest(registry)
    except DatabaseError as error:
        # 503, so that Prometheus records the scrape as failed rather than the work as gone.
        return HttpResponse(
            f"the database did not answer ({type(error).__name__})\n", status=503, content_type="text/plain"
        )
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
