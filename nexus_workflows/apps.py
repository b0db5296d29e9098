from django.apps import AppConfig


class NexusWorkflowsConfig(AppConfig):
    name = "nexus_workflows"
    verbose_name = "Workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from nexus_workflows import checks  # noqa: F401 - registers the system checks
        from nexus_workflows.airtable import checks as airtable_checks  # noqa: F401 - registers the Airtable checks
        from nexus_workflows.deferred.registry import autodiscover, registry
        from nexus_workflows.fire_and_forget import checks as rq_checks  # noqa: F401 - registers the django-rq checks
        from nexus_workflows.phi import checks as phi_checks  # noqa: F401 - registers the PHI checks
        from nexus_workflows.tasks.running import task_workflow

        registry.task_adapter = task_workflow
        autodiscover()
