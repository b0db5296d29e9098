"""Claims whose answer an outage lost: the database ran the ``UPDATE`` (its rows are
processing under the claim's token), then the connection went away before the rows came
back. Nothing of theirs was handed out, so nothing runs them; left alone they would sit
processing, holding their kind's slots and serial keys, until ``STALE_AFTER`` (five
minutes by default) had them reclaimed. The runner gives them back instead, at its first
turn on which the database answers: pending again, due now, attempt unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from nexus_workflows.deferred import transitions

#: Seconds a lost claim's token is given back again at every turn: its statement may
#: still have been running on the old session (the server had not yet noticed it was
#: gone) when the first give-back ran, and taken its rows after it.
SETTLE = 5.0


class UnansweredClaims:
    """The tokens of claims that raised because the database went away (``add``, from the
    claimers), until a give-back has run ``SETTLE`` seconds after each was lost. Used by
    the runner's main loop only, which makes every claim."""

    def __init__(
        self, using: str, *, settle: float = SETTLE, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.using = using
        self.settle = settle
        self._monotonic = monotonic
        self._lost_at: dict[str, float] = {}

    def add(self, token: str) -> None:
        self._lost_at[token] = self._monotonic()

    def __bool__(self) -> bool:
        return bool(self._lost_at)

    def give_back(self) -> int:
        """Release every row still held under a lost token (one ``UPDATE``); returns how
        many. Raises what the database raises: the token stays for the next turn."""
        if not self._lost_at:
            return 0
        released = transitions.release_unanswered(self.using, list(self._lost_at))
        settled = self._monotonic() - self.settle
        self._lost_at = {token: at for token, at in self._lost_at.items() if at > settled}
        return released
