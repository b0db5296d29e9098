"""Sizes shared by the models and the validation that runs before the app is loaded."""

KIND_MAX_LENGTH = 100
# The kind column: a workflow kind (at most KIND_MAX_LENGTH) or a Django task's import path.
KIND_COLUMN_LENGTH = 255
QUEUE_NAME_MAX_LENGTH = 100
BACKEND_ALIAS_MAX_LENGTH = 100
# A Django task's error keeps the end of its traceback, where the cause is.
TRACEBACK_MAX_LENGTH = 20_000
DEDUPE_KEY_MAX_LENGTH = 255
LAST_ERROR_MAX_LENGTH = 2000
HISTORY_MAX_ENTRIES = 25
