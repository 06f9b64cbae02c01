"""Trace loaders: public cluster traces, the generic CSV format and recorded Quartermaster logs."""

from libs.sim.traces.alibaba import parse_alibaba
from libs.sim.traces.csv_trace import parse_csv_trace
from libs.sim.traces.dirlab import parse_dirlab
from libs.sim.traces.eventlog import RecordedLog, load_event_log, read_envelopes
from libs.sim.traces.raw import RawJob, TraceError, load_csv, select

__all__ = [
    "RawJob",
    "RecordedLog",
    "TraceError",
    "load_csv",
    "load_event_log",
    "parse_alibaba",
    "parse_csv_trace",
    "parse_dirlab",
    "read_envelopes",
    "select",
]
