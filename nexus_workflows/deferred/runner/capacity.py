"""How much work a runner holds: its slots plus a prefetch of quick work."""

from __future__ import annotations

# How much quick work a runner claims ahead of its free slots, in seconds of work per
# slot: enough to amortise the claim queries over many no-op items, nothing for slow
# items (which other runners should be free to take).
PREFETCH_SECONDS = 0.05
RUNTIME_SMOOTHING = 0.2


class Capacity:
    """The claim sizing of one runner; pure arithmetic, no I/O.

    ``concurrency`` slots run attempts; quick work (judged by a moving average of attempt
    durations) is prefetched up to ``batch_size`` items so the claim queries amortise.
    """

    def __init__(self, concurrency: int, batch_size: int) -> None:
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.average_runtime: float | None = None

    def observe(self, duration: float) -> None:
        """Fold one finished attempt's duration (seconds) into the moving average."""
        if self.average_runtime is None:
            self.average_runtime = duration
        else:
            self.average_runtime += RUNTIME_SMOOTHING * (duration - self.average_runtime)

    def finishing_soon(self) -> int:
        """Attempts the slots are expected to finish within ``PREFETCH_SECONDS``, by the
        moving average (0 until one finished): the prefetch, before the batch cap; and how
        many busy slots a limited item may be claimed for (``Ledger.limited_room``), since
        it is handed out first and so waits for no more than the first of them to end."""
        if self.average_runtime is None:
            return 0
        return int(self.concurrency * (PREFETCH_SECONDS / max(self.average_runtime, 1e-6)))

    def bounds(self) -> tuple[int, int]:
        """(most items to hold, refill when holding no more than this)."""
        prefetch = min(self.batch_size, self.finishing_soon())
        return self.concurrency + prefetch, self.concurrency + prefetch // 2

    def wants_more(self, held: int) -> bool:
        """Whether a runner holding ``held`` items should claim now."""
        high, low = self.bounds()
        return held <= low and held < high

    def claim_limit(self, held: int) -> int:
        """How many rows one claim may take while ``held`` items are held (≤ 0: none)."""
        return min(self.bounds()[0] - held, max(self.batch_size, self.concurrency))
