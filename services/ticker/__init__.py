"""The ticker: the passage of time as an input like any other.

The scheduler never reads a clock; every ``QM_TICK_SECONDS`` this service
appends a ``ClockTick`` to each cluster's partition of the events topic, so
timeouts and usage advance even when nothing else happens.
"""
