from django.contrib import admin
from django.urls import path

from nexus_workflows.views import metrics

# django-rq 4 mounts its queue and failed-job views inside the admin
# (/admin/django_rq/dashboard/), so the admin is the only URL the project needs.
# The triage desk's list is wide (kind, key, status, attempts, timing, error): give it the
# whole page instead of sharing it with the navigation sidebar.
admin.site.enable_nav_sidebar = False

urlpatterns = [
    path("admin/", admin.site.urls),
    # Prometheus: the database's figures (runners serve their own on --metrics-port). A
    # deployment keeps this path internal (its proxy does not route it from outside).
    path("internal/metrics", metrics, name="nexus_workflows_metrics"),
]
