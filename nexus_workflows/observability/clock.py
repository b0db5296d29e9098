"""The database's clock (see :mod:`nexus_workflows.clock`)."""

from nexus_workflows.clock import database_now

__all__ = ["database_now"]
