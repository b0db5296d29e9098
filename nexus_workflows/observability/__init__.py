"""What an operator sees of deferred work: live runners, outcome counts, metrics, logs.

The runner calls one :class:`~nexus_workflows.observability.observer.Observer` at a few
points (claim, start, end, outcome written, heartbeat, outage, stop); everything else here
reads the database.
"""
