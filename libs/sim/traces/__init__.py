"""Trace loaders: public cluster traces and recorded Quartermaster logs."""

from libs.sim.traces.alibaba import load_alibaba, parse_alibaba
from libs.sim.traces.eventlog import RecordedLog, load_event_log, read_envelopes
from libs.sim.traces.philly import load_philly, parse_philly
from libs.sim.traces.raw import RawJob, TraceError, select

__all__ = [
    "RawJob",
    "RecordedLog",
    "TraceError",
    "load_alibaba",
    "load_event_log",
    "load_philly",
    "parse_alibaba",
    "parse_philly",
    "read_envelopes",
    "select",
]
