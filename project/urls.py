from django.contrib import admin
from django.urls import path

# django-rq 4 mounts its queue and failed-job views inside the admin
# (/admin/django_rq/dashboard/), so the admin is the only URL the project needs.
urlpatterns = [
    path("admin/", admin.site.urls),
]
