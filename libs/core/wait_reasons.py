"""Why a job waits, as a code with fields: what the core decides. The words are the
edge's (the recorded ``JobPending``, ``qm why``), rendered from the code by ``words``.

A code names one cause, so a reader (the console, a script, an alert) can count and
act on causes without parsing sentences; its fields carry the figures the words
quote, as text. Each code's words are declared once, here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class WaitCode(StrEnum):
    # No node may ever take the job as the cluster is (``capacity.py``).
    NO_NODES = "no_nodes"
    NO_SUCH_NODE = "no_such_node"
    WORKFLOW_NODES_ONLY = "workflow_nodes_only"
    NO_COMMAND_NODES = "no_command_nodes"
    TOO_FEW_GPUS = "too_few_gpus"
    TOO_FEW_NODES = "too_few_nodes"
    TOO_WIDE = "too_wide"
    # It would fit an empty cluster: it waits for room.
    NO_BLOCK = "no_block"
    NO_WHOLE_NODES = "no_whole_nodes"
    NO_ROOM_FOR_PARTS = "no_room_for_parts"
    BEING_FREED = "being_freed"
    NODES_EARMARKED = "nodes_earmarked"
    # It waits for others: jobs it names, or the user who holds it.
    DEPENDENCY = "dependency"
    HELD_BY_USER = "held_by_user"
    # A workflow (``compass/``).
    WORKFLOWS_SHED = "workflows_shed"
    NO_GPU_MEMORY = "no_gpu_memory"
    WORKFLOW_HELD = "workflow_held"
    SERVING_AT_LIMIT = "serving_at_limit"
    NO_SERVING_GPU = "no_serving_gpu"
    # The baseline policies the simulator compares with (``baselines/``).
    NEVER_FITS = "never_fits"
    FIRST_IN_LINE = "first_in_line"
    IN_LINE = "in_line"
    BEHIND_PRIORITY = "behind_priority"


# Each code's words, with its fields in braces: declared once, for every edge.
WORDS: dict[WaitCode, str] = {
    WaitCode.NO_NODES: "needs {needs}; no node has registered yet",
    WaitCode.NO_SUCH_NODE: "needs {needs}; no registered node has that type",
    WaitCode.WORKFLOW_NODES_ONLY: "needs {needs}; {nodes} take workflows only",
    WaitCode.NO_COMMAND_NODES: (
        "needs {needs}; {nodes} run no command (simulated; QM_SIMULATED_SECONDS in its "
        "env asks for a simulated run)"
    ),
    WaitCode.TOO_FEW_GPUS: "needs {needs}; the cluster has only {total} such GPUs",
    WaitCode.TOO_FEW_NODES: (
        "needs {needs} as {parts} parts of {per} on distinct nodes; only {able} such "
        "nodes have {per} GPUs"
    ),
    WaitCode.TOO_WIDE: "needs {needs} on {nodes} whole nodes; a job may span at most {most}",
    WaitCode.NO_BLOCK: "needs {needs} on one node; waiting for a block that large to free up",
    WaitCode.NO_WHOLE_NODES: "needs {needs} on {nodes} whole nodes; waiting for them to free up",
    WaitCode.NO_ROOM_FOR_PARTS: (
        "needs {needs} as {parts} parts of {per} on distinct nodes; waiting for room on "
        "{parts} nodes"
    ),
    WaitCode.BEING_FREED: "needs {needs}; GPUs are being freed for it on {nodes}",
    WaitCode.NODES_EARMARKED: "needs {needs}; {nodes} are earmarked for it as they free up",
    WaitCode.DEPENDENCY: "waits for {job} {how} (after {after})",
    WaitCode.HELD_BY_USER: "held by {who}: starts once released (qm release)",
    WaitCode.WORKFLOWS_SHED: (
        "held while workflows bring more work than the serving GPUs run ({admit_load}× "
        "their time): those with the most work wait, each till its due time at the latest"
    ),
    WaitCode.NO_GPU_MEMORY: (
        "needs a GPU ({kind}) with room for a {model_mb} MB model; no registered GPU has "
        "that much memory"
    ),
    WaitCode.WORKFLOW_HELD: (
        "held while the serving GPUs work through their queues: a plan now would start "
        "it more than {threshold}× its best-case time late; held workflows go earliest "
        "due first (arrival + that many best-case times)"
    ),
    WaitCode.SERVING_AT_LIMIT: "waiting for a serving GPU: serving holds its limit of {cap} GPUs",
    WaitCode.NO_SERVING_GPU: (
        "waiting for a GPU free of batch work (serving holds {held} of at most {cap})"
    ),
    WaitCode.NEVER_FITS: "needs {gpus} GPUs; the registered nodes do not have that many",
    WaitCode.FIRST_IN_LINE: "first in line; needs {gpus} GPUs, not free yet",
    WaitCode.IN_LINE: "in arrival order behind {ahead} earlier jobs",
    WaitCode.BEHIND_PRIORITY: (
        "{level}: needs {gpus} GPUs; waits for them behind higher or earlier work"
    ),
}


@dataclass(frozen=True, slots=True)
class WaitReason:
    """A cause and the figures its words quote, in the order the words name them."""

    code: WaitCode
    fields: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, code: WaitCode, **fields: object) -> WaitReason:
        return cls(code, tuple([(name, str(value)) for name, value in fields.items()]))

    def words(self) -> str:
        """The reason for the person who asks why."""
        return WORDS[self.code].format_map(dict(self.fields))

    def fact(self) -> str:
        """As declared state: its code and fields (its words follow from them; the
        digest need not render them)."""
        return f"{self.code.value}{self.fields!r}"
