"""Claims whose answer an outage lost: the database ran the ``UPDATE`` (its rows are
processing under the claim's token), then the connection went away before the rows came
back. Nothing of theirs was handed out, so nothing runs them; left alone they would sit
processing, holding their kind's slots and serial keys, until ``STALE_AFTER`` (five
minutes by default) had them reclaimed. The runner gives them back instead, at its first
turn on which the database answers: pending again, due now, attempt unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from nexus_workflows.deferred import transitions
from nexus_workflows.flow import starts, windows

#: Seconds a lost claim's token is given back again at every turn after its first
#: give-back: its statement may still have been running on the old session (the server had
#: not yet noticed it was gone) when that one ran, and taken its rows after it.
SETTLE = 5.0


class UnansweredClaims:
    """The tokens of claims that raised because the database went away (``add``, from the
    claimers), until ``SETTLE`` seconds after the first give-back that ran for each. Used
    by the runner's main loop only, which makes every claim."""

    def __init__(
        self, using: str, *, settle: float = SETTLE, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.using = using
        self.settle = settle
        self._monotonic = monotonic
        # Token -> when to stop giving it back (None: no give-back has run for it yet).
        self._until: dict[str, float | None] = {}
        # Token -> the rate-window starts its claim reserved (a rate-limited kind's claim).
        self._reserved: dict[str, Sequence[windows.Reservation]] = {}

    def add(self, token: str, reservations: Sequence[windows.Reservation] = ()) -> None:
        self._until[token] = None
        if reservations:
            self._reserved[token] = reservations

    def __bool__(self) -> bool:
        return bool(self._until)

    def give_back(self) -> int:
        """Release every row still held under a lost token (one ``UPDATE``, and one more
        the first time for each claim that reserved window starts); returns how many.
        Raises what the database raises: the tokens stay for the next turn."""
        if not self._until:
            return 0
        first = list(self._reserved)  # given back on their own this once (their starts too)
        released = sum(self._give_back_reserved(token) for token in first)
        released += transitions.release_unanswered(self.using, [t for t in self._until if t not in first])
        now = self._monotonic()
        until = {token: now + self.settle if at is None else at for token, at in self._until.items()}
        self._until = {token: at for token, at in until.items() if at > now}
        return released

    def _give_back_reserved(self, token: str) -> int:
        """The rows of a claim that reserved rate-window starts, on their own, and those
        starts too if rows were found: its transaction (committed) reserved them. Else
        they stay (their slots may be another claim's since) until they lapse."""
        released = transitions.release_unanswered(self.using, [token])
        if released:
            starts.give_back_reserved(self._reserved[token], using=self.using)
        del self._reserved[token]
        return released

    def forget(self) -> None:
        """Stop giving back: what the tokens hold goes stale and is reclaimed, as before."""
        self._until.clear()
        self._reserved.clear()
