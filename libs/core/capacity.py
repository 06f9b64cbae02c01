"""Where work fits: an index of free GPUs by node class and free count.

Best fit: a job goes to the matching node with the fewest free GPUs that
still holds it, which keeps large blocks whole for large jobs. A job that names
its nodes takes that many distinct nodes, each the fullest that holds a part;
one larger than any node (a trace's) takes whole free nodes; all or nothing. Every
answer is a value: the GPUs to use, or a reason a person can act on.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Set
from dataclasses import dataclass
from typing import NamedTuple

from libs.core.ids import NodeId
from libs.core.limits import MAX_GANG_NODES
from libs.core.model import JobSpec, NodeKind, NodeSpec
from libs.core.state import State, Table
from libs.core.wait_reasons import WaitCode, WaitReason

_NodeClass = tuple[str, float, NodeKind]  # (GPU type, GPU memory in GiB, what it runs)


def node_class(node: NodeSpec) -> _NodeClass:
    return node.gpu_type, node.gpu_memory_gib, node.kind


_Asked = tuple[str, float, frozenset[NodeKind]]  # what a job asks of a node's class


def _asked(spec: JobSpec) -> _Asked:
    return spec.gpu_type, spec.min_gpu_memory_gib, spec.node_kinds


def _class_order(cls: _NodeClass) -> tuple[str, float, str]:
    return cls[0], cls[1], cls[2].value


def _matches(spec: JobSpec, cls: _NodeClass) -> bool:
    return spec.may_use(*cls)


@dataclass(frozen=True)
class Fit:
    tasks: tuple[tuple[NodeId, tuple[int, ...]], ...]  # (node id, GPU indices) per node


@dataclass(frozen=True)
class NoFit:
    why: WaitReason  # stable while the job waits for room: its ``Wait``
    possible: bool = False  # would fit an empty cluster: it only waits for room
    figures: str = ""  # the words with the current numbers, for `qm why`

    @property
    def reason(self) -> str:
        """For `qm why`: with the current numbers where they move."""
        return self.figures or self.why.words()


def describe(spec: JobSpec) -> str:
    memory = f" with ≥{spec.min_gpu_memory_gib:g} GiB" if spec.min_gpu_memory_gib else ""
    return f"{spec.gpus}×{spec.gpu_type or 'GPU'}{memory}"


class Free(NamedTuple):
    gpus: tuple[int, ...]  # the node's free GPU indices, sorted
    since: int  # when the node got this many free GPUs: its place in its bucket


class Capacity:
    DERIVED = ("_by_class", "_class_size", "_class_total", "total_gpus", "total_free")

    def __init__(self, state: State | None = None) -> None:
        state = state or State()
        # Declared state: the nodes and their free GPUs; every other field is an
        # index over them (``derived`` rebuilds them, tests compare).
        self.nodes: Table[NodeId, NodeSpec] = state.table("capacity.nodes")
        self._free: Table[NodeId, Free] = state.table("capacity.free")
        self._moves = state.cell("capacity.moves", 0)  # stamps Free.since
        # Nodes an operator took out of scheduling: their free GPUs are kept (in
        # ``_free``) but in no index, so nothing is placed or planned there. A cordon
        # outlives the node's loss and re-registration: it is the operator's to lift.
        self._cordoned: Table[NodeId, None] = state.table("capacity.cordoned")
        # class -> free count -> nodes, in the order they got that count: taking
        # the first is O(1) and deterministic (the order follows the input).
        self._by_class: dict[_NodeClass, dict[int, dict[NodeId, None]]] = {}
        self._class_size: dict[_NodeClass, int] = {}  # the most GPUs a node of the class has
        self._class_total: dict[_NodeClass, int] = {}
        self.total_gpus = 0
        self.total_free = 0
        # The last ``shape`` asked and its answer, until the indexes change: every
        # allocation of a pass asks it, mostly of the same nodes.
        self._shape: tuple[frozenset[NodeId], tuple[int, int, int]] | None = None
        # Memos, dropped as nodes join, leave, change or are cordoned: per (GPU type,
        # memory, node kinds) asked, the nodes that match (every preemption plan reads
        # them, sorted).
        self._schedulable: dict[_Asked, dict[NodeId, int]] = {}
        # ... and the node classes that match (every fit asks, of a handful of classes).
        self._matching: dict[_Asked, list[_NodeClass]] = {}
        # Moves as nodes join, change or leave: what is priced by node (``Charges``) keys on it.
        self.generation = 0

    def add(self, node: NodeSpec, held: Collection[int]) -> None:
        """Register or re-register a node; ``held`` GPUs stay taken by running tasks."""
        old = self.nodes.get(node.node_id)
        if old is not None:
            self._uncount(old)
        self._nodes_changed()
        self.nodes[node.node_id] = node  # a re-registered node keeps its place
        free = tuple(g for g in sorted(node.gpu_indices) if g not in held)
        self.total_gpus += node.gpu_count
        self.total_free += self._usable(node.node_id, len(free))
        self._index(node.node_id, free)
        cls = node_class(node)
        self._class_size[cls] = max(self._class_size.get(cls, 0), node.gpu_count)
        self._class_total[cls] = self._class_total.get(cls, 0) + node.gpu_count

    def remove(self, node_id: NodeId) -> None:
        """A node leaves (it was lost): its GPUs, free or not, are no longer counted."""
        node = self.nodes.get(node_id)
        if node is not None:
            self._uncount(node)
            del self.nodes[node_id], self._free[node_id]
            self._nodes_changed()

    def _nodes_changed(self) -> None:
        self._schedulable, self._matching = {}, {}
        self.generation += 1

    def _uncount(self, node: NodeSpec) -> None:
        """Take a node out of the indexes and totals (its class too, if it was the last)."""
        self._unindex(node.node_id)
        cls = node_class(node)
        if not self._by_class.get(cls):
            self._by_class.pop(cls, None)
        self.total_gpus -= node.gpu_count
        self.total_free -= self._usable(node.node_id, len(self.free(node.node_id)))
        self._class_total[cls] -= node.gpu_count
        sizes = [
            n.gpu_count
            for n in self.nodes.values()
            if node_class(n) == cls and n.node_id != node.node_id
        ]
        if sizes:
            self._class_size[cls] = max(sizes)
        else:
            del self._class_size[cls], self._class_total[cls]

    def cordon(self, node_id: NodeId, cordoned: bool) -> None:
        """Take a node out of scheduling (``cordoned``) or give it back; what runs there
        runs on, and the GPUs it frees stay out of use until the node is uncordoned."""
        if (node_id in self._cordoned) == cordoned:
            return
        self._schedulable, self._matching = {}, {}
        known = node_id in self.nodes
        if cordoned:
            if known:
                self._unindex(node_id)
                self.total_free -= len(self.free(node_id))
            self._cordoned[node_id] = None
        else:
            del self._cordoned[node_id]
            if known:
                self.total_free += len(self.free(node_id))
                self._index(node_id, self.free(node_id))

    def is_cordoned(self, node_id: NodeId) -> bool:
        return node_id in self._cordoned

    def _usable(self, node_id: NodeId, gpus: int) -> int:
        """Of ``gpus`` free GPUs on the node, how many count as free (none if cordoned)."""
        return 0 if node_id in self._cordoned else gpus

    def free(self, node_id: NodeId) -> tuple[int, ...]:
        free = self._free.get(node_id)
        return () if free is None else free.gpus

    def schedulable(self, spec: JobSpec) -> Mapping[NodeId, int]:
        """The nodes not cordoned that match ``spec``, in node id order, with their GPU
        counts (what preemption plans over: kept until nodes change)."""
        key = _asked(spec)
        nodes = self._schedulable.get(key)
        if nodes is None:
            nodes = self._schedulable[key] = {
                node_id: node.gpu_count
                for node_id, node in sorted(self.nodes.items())
                if node_id not in self._cordoned and _matches(spec, node_class(node))
            }
        return nodes

    def partly_free(self, spec: JobSpec, most: int) -> list[NodeId]:
        """The nodes of ``schedulable`` with 1 to ``most`` free GPUs (in no order)."""
        return [
            node_id
            for cls in self.matching(spec)
            for count, nodes in self._by_class[cls].items()
            if 0 < count <= most
            for node_id in nodes
        ]

    def take(self, node_id: NodeId, gpus: Collection[int]) -> None:
        self._unindex(node_id)
        before = self.free(node_id)
        after = tuple(g for g in before if g not in gpus)
        self.total_free -= self._usable(node_id, len(before) - len(after))
        self._index(node_id, after)

    def give(self, node_id: NodeId, gpus: Collection[int]) -> None:
        node = self.nodes.get(node_id)
        if node is None:
            return
        self._unindex(node_id)
        before = self.free(node_id)
        back = [g for g in gpus if g in node.gpu_indices and g not in before]
        self.total_free += self._usable(node_id, len(back))
        self._index(node_id, tuple(sorted((*before, *back))))

    def matching(self, spec: JobSpec) -> list[_NodeClass]:
        """The node classes ``spec`` may use, in a fixed order (kept until nodes change)."""
        key = _asked(spec)
        classes = self._matching.get(key)
        if classes is None:
            classes = self._matching[key] = sorted(
                (cls for cls in self._by_class if _matches(spec, cls)), key=_class_order
            )
        return classes

    def fit(self, spec: JobSpec, blocked: Collection[NodeId] = ()) -> Fit | NoFit:
        classes = self.matching(spec)
        largest_node = max((self._class_size[c] for c in classes), default=0)
        if largest_node == 0:
            if not self.nodes:
                return NoFit(WaitReason.of(WaitCode.NO_NODES, needs=describe(spec)))
            return NoFit(self._none_takes(spec))
        if spec.parts > 1:
            return self._fit_parts(spec, classes, blocked)
        if spec.gpus > largest_node:
            total = sum(self._class_total[c] for c in classes)
            if spec.gpus > total:
                return NoFit(
                    WaitReason.of(WaitCode.TOO_FEW_GPUS, needs=describe(spec), total=total)
                )
            return self._fit_gang(spec, classes, largest_node, blocked)
        best: tuple[int, NodeId] | None = None
        largest_free = 0
        for cls in classes:
            for count, nodes in self._by_class[cls].items():
                first = next((n for n in nodes if n not in blocked), None)
                if first is None:
                    continue
                largest_free = max(largest_free, count)
                if count >= spec.gpus:
                    choice = (count, first)
                    if best is None or choice < best:
                        best = choice
        if best is None:
            needs = describe(spec)
            return NoFit(
                WaitReason.of(WaitCode.NO_BLOCK, needs=needs),
                possible=True,
                figures=f"needs {needs} on one node; the largest free block is {largest_free}",
            )
        node_id = best[1]
        return Fit(((node_id, self.free(node_id)[: spec.gpus]),))

    def _fit_parts(
        self, spec: JobSpec, classes: list[_NodeClass], blocked: Collection[NodeId]
    ) -> Fit | NoFit:
        """``spec.parts`` distinct nodes with ``spec.block`` free GPUs each, the fullest
        that hold a part first (then by node id), rank 0 on the first."""
        per, parts, needs = spec.block, spec.parts, describe(spec)
        able = sum(
            1
            for node in self.nodes.values()
            if node.gpu_count >= per and _matches(spec, node_class(node))
        )
        if able < parts:
            why = WaitReason.of(
                WaitCode.TOO_FEW_NODES, needs=needs, parts=parts, per=per, able=able
            )
            return NoFit(why)
        holding = sorted(
            (count, node_id)
            for cls in classes
            for count, nodes in self._by_class[cls].items()
            if count >= per
            for node_id in nodes
            if node_id not in blocked
        )
        if len(holding) < parts:
            have = f"{len(holding)} {'has' if len(holding) == 1 else 'have'} room"
            return NoFit(
                WaitReason.of(WaitCode.NO_ROOM_FOR_PARTS, needs=needs, parts=parts, per=per),
                possible=True,
                figures=f"needs {needs} as {parts} parts of {per} on distinct nodes; {have}",
            )
        return Fit(tuple((node_id, self.free(node_id)[:per]) for _, node_id in holding[:parts]))

    def _none_takes(self, spec: JobSpec) -> WaitReason:
        """Why no registered node may take the job: none has its type (and memory), or
        those that do run other work than it needs."""
        kinds = {
            kind
            for gpu_type, memory, kind in self._class_size
            if spec.wants_type(gpu_type) and memory >= spec.min_gpu_memory_gib
        }
        needs = describe(spec)
        if not kinds or kinds & spec.node_kinds:
            return WaitReason.of(WaitCode.NO_SUCH_NODE, needs=needs)
        nodes = f"the {spec.gpu_type} nodes" if spec.gpu_type else "the nodes"
        if kinds == {NodeKind.SERVING}:
            return WaitReason.of(WaitCode.WORKFLOW_NODES_ONLY, needs=needs, nodes=nodes)
        return WaitReason.of(WaitCode.NO_COMMAND_NODES, needs=needs, nodes=nodes)

    def shape(self, blocked: Set[NodeId] = frozenset()) -> tuple[int, int, int]:
        """(largest free block, largest node, GPUs on wholly free largest nodes),
        leaving out ``blocked`` nodes."""
        memo = self._shape
        # The same frozen set (reservations keep theirs until they change) is the
        # common case, and comparing a large set with itself walks all of it.
        if memo is not None and (memo[0] is blocked or memo[0] == blocked):
            return memo[1]

        def unblocked(nodes: dict[NodeId, None]) -> int:
            # Counted through the smaller side: every pass asks, and either may be large.
            if not blocked:
                return len(nodes)
            if len(blocked) < len(nodes):
                return len(nodes) - sum(1 for n in blocked if n in nodes)
            return sum(1 for n in nodes if n not in blocked)

        largest = max(
            (
                count
                for buckets in self._by_class.values()
                for count, nodes in buckets.items()
                if unblocked(nodes)
            ),
            default=0,
        )
        node_size = max(self._class_size.values(), default=0)
        whole = sum(
            unblocked(nodes) * node_size
            for cls, buckets in self._by_class.items()
            if self._class_size[cls] == node_size
            for count, nodes in buckets.items()
            if count == node_size
        )
        frozen = blocked if isinstance(blocked, frozenset) else frozenset(blocked)
        self._shape = frozen, (largest, node_size, whole)
        return largest, node_size, whole

    def _fit_gang(
        self, spec: JobSpec, classes: list[_NodeClass], node_size: int, blocked: Collection[NodeId]
    ) -> Fit | NoFit:
        whole = sorted(
            n
            for cls in classes
            for n in self._by_class[cls].get(node_size, ())
            if n not in blocked and self.nodes[n].gpu_count == node_size
        )
        needed = -(-spec.gpus // node_size)
        needs = describe(spec)
        if needed > MAX_GANG_NODES:
            return NoFit(
                WaitReason.of(WaitCode.TOO_WIDE, needs=needs, nodes=needed, most=MAX_GANG_NODES)
            )
        if len(whole) < needed:
            free = f"{len(whole)} {'is' if len(whole) == 1 else 'are'} free"
            return NoFit(
                WaitReason.of(WaitCode.NO_WHOLE_NODES, needs=needs, nodes=needed),
                possible=True,
                figures=f"needs {needs} on {needed} whole nodes; {free}",
            )
        tasks = []
        remaining = spec.gpus
        for node_id in whole[:needed]:
            take = min(node_size, remaining)
            tasks.append((node_id, self.free(node_id)[:take]))
            remaining -= take
        return Fit(tuple(tasks))

    def derived(self) -> tuple[object, ...]:
        """The indexes rebuilt from the declared state alone (tests compare them)."""
        by_class: dict[_NodeClass, dict[int, dict[NodeId, None]]] = {}
        sizes: dict[_NodeClass, int] = {}
        totals: dict[_NodeClass, int] = {}
        for node_id, free in sorted(self._free.items(), key=lambda item: item[1].since):
            node = self.nodes[node_id]
            cls = node_class(node)
            if node_id not in self._cordoned:
                by_class.setdefault(cls, {}).setdefault(len(free.gpus), {})[node_id] = None
            sizes[cls] = max(sizes.get(cls, 0), node.gpu_count)
            totals[cls] = totals.get(cls, 0) + node.gpu_count
        free_gpus = sum(
            len(free.gpus) for node_id, free in self._free.items() if node_id not in self._cordoned
        )
        total = sum(node.gpu_count for node in self.nodes.values())
        return by_class, sizes, totals, total, free_gpus

    def indexes(self) -> tuple[object, ...]:
        """The indexes as kept, in the shape of ``derived``."""
        by_class = {cls: buckets for cls, buckets in self._by_class.items() if buckets}
        return by_class, self._class_size, self._class_total, self.total_gpus, self.total_free

    def _index(self, node_id: NodeId, free: tuple[int, ...]) -> None:
        node = self.nodes[node_id]
        if node_id not in self._cordoned:
            buckets = self._by_class.setdefault(node_class(node), {})
            buckets.setdefault(len(free), {})[node_id] = None
        self._shape = None
        self._moves.value += 1
        self._free[node_id] = Free(free, self._moves.value)

    def _unindex(self, node_id: NodeId) -> None:
        self._shape = None
        if node_id in self._cordoned:
            return  # in no index
        buckets = self._by_class[node_class(self.nodes[node_id])]
        count = len(self.free(node_id))
        del buckets[count][node_id]
        if not buckets[count]:
            del buckets[count]
