"""The views read-model tests fold their envelopes into."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import reduce
from typing import TypeVar

from qm.v1 import events_pb2, types_pb2

from libs.readmodels import apply_job_event, apply_node_event

View = TypeVar("View")


def folded_job(events: Iterable[events_pb2.Envelope]) -> types_pb2.Job:
    """The job the events fold into, one after the other from nothing."""
    return _folded(apply_job_event, events)


def folded_node(events: Iterable[events_pb2.Envelope]) -> types_pb2.Node:
    return _folded(apply_node_event, events)


def _folded(
    apply: Callable[[View | None, events_pb2.Envelope], View | None],
    events: Iterable[events_pb2.Envelope],
) -> View:
    view = reduce(apply, events, None)
    assert view is not None, "the events are about nothing"
    return view
