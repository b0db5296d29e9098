"""Sizes shared by the models and the validation that runs before the app is loaded."""

KIND_MAX_LENGTH = 100
DEDUPE_KEY_MAX_LENGTH = 255
LAST_ERROR_MAX_LENGTH = 2000
HISTORY_MAX_ENTRIES = 25
