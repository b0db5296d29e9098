from .phi import admin as phi_admin  # noqa: F401 - registers the PHI token map admin
