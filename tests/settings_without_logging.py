"""The test settings of a project that configures no logging of its own."""

from tests.settings import *  # noqa: F403

LOGGING: dict = {}
