"""How the agent's reports reach the log: in an envelope that names the node, the job and
the decision behind them, sent again while the bus refuses them."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from google.protobuf.message import Message
from qm.v1 import events_pb2, types_pb2
from tenacity import AsyncRetrying, wait_exponential

from libs.events import event_type, new_envelope
from services.node_agent.lifecycle import producer_name

log = logging.getLogger(__name__)

Emit = Callable[[events_pb2.Envelope], Awaitable[None]]

# A report that could not be sent (the broker is down) is tried again after this,
# doubling up to the most: no task end is dropped while the agent runs.
RETRY_FIRST_S = 0.5
RETRY_MOST_S = 10.0
CLOSING_TRIES = 3  # once the agent is shutting down


def envelope(
    node: types_pb2.NodeInventory,
    payload: Message,
    task: events_pb2.TaskPlaced | None = None,
    cause: str = "",
) -> events_pb2.Envelope:
    """A report from ``node``, about ``task``'s job if given, caused by the event ``cause``."""
    return new_envelope(
        payload,
        producer=producer_name(node.node_id),
        cluster=node.cluster,
        correlation_id=task.job_id if task else "",
        causation_id=cause,
    )


class Reporter:
    """Sends reports through ``emit``, trying again while the bus refuses them: a task end
    that never reaches placement would hold its GPUs until the node is declared lost.
    Once ``closing`` (the agent is shutting down), a report gets a few tries only."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.closing = False

    async def __call__(
        self,
        node: types_pb2.NodeInventory,
        payload: Message,
        task: events_pb2.TaskPlaced | None = None,
        cause: str = "",
    ) -> None:
        env = envelope(node, payload, task, cause)
        retrying = AsyncRetrying(
            wait=wait_exponential(multiplier=RETRY_FIRST_S, max=RETRY_MOST_S),
            stop=lambda state: self.closing and state.attempt_number >= CLOSING_TRIES,
            before_sleep=lambda state: log.warning(
                "%s not sent (%s); again in %.1f s",
                event_type(env),
                state.outcome.exception() if state.outcome else "?",
                state.upcoming_sleep,
            ),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                await self.emit(env)
