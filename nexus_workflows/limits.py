"""Sizes shared by the models and the validation that runs before the app is loaded."""

from datetime import timedelta

KIND_MAX_LENGTH = 100
DEDUPE_KEY_MAX_LENGTH = 255
LAST_ERROR_MAX_LENGTH = 2000
HISTORY_MAX_ENTRIES = 25
#: Longest ``delay`` (and fire-and-forget ``job_timeout``) accepted: ten years, far
#: inside what datetimes and Redis can represent.
MAX_DELAY = timedelta(days=3653)
