"""Flow control: concurrency caps, serial and ordered keys, and sliding-window rate
limits, decided by the database for every runner that shares it.

See the README's "Flow control" section for the rules.
"""

from nexus_workflows.flow.options import FlowLimits
from nexus_workflows.flow.windows import rate_limited

__all__ = ["FlowLimits", "rate_limited"]
