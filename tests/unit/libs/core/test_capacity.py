"""Capacity (``libs/core/capacity.py``): free GPUs by node class, best fit, gangs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from libs.core.capacity import Capacity, Fit, NoFit, describe
from libs.core.limits import MAX_GANG_NODES
from libs.core.model import NodeKind, NodeSpec
from libs.core.wait_reasons import WaitCode, WaitReason
from tests.builders import job, node


def no_fit(fit: Fit | NoFit) -> NoFit:
    assert isinstance(fit, NoFit), fit
    return fit


def sized(node_id: str, gpus: int, gpu_type: str = "H100", memory: float = 80.0) -> NodeSpec:
    return NodeSpec(node_id, gpu_type, tuple(range(gpus)), memory)


def capacity(*nodes: NodeSpec) -> Capacity:
    c = Capacity()
    for n in nodes:
        c.add(n, ())
    return c


def test_a_job_goes_to_the_fullest_node_that_holds_it() -> None:
    c = capacity(node("n0", 8), node("n1", 8), node("n2", 8))
    c.take("n0", (0, 1, 2, 3, 4))  # 3 free
    c.take("n1", (0, 1, 2, 3, 4, 5))  # 2 free
    assert c.fit(job(2)) == Fit((("n1", (6, 7)),))
    assert c.fit(job(3)) == Fit((("n0", (5, 6, 7)),))
    assert c.fit(job(4)) == Fit((("n2", (0, 1, 2, 3)),))  # keeps n0 and n1's blocks for small jobs


def test_the_lowest_free_gpu_indices_are_used() -> None:
    c = capacity(node("n0", 8))
    c.take("n0", (0, 2, 4))
    assert c.fit(job(3)) == Fit((("n0", (1, 3, 5)),))


def test_among_equally_full_nodes_the_one_that_got_that_count_first_wins() -> None:
    # Not the node id: the order follows the input, which is deterministic and O(1).
    c = capacity(node("n1", 8), node("n0", 8))
    assert c.fit(job(1)) == Fit((("n1", (0,)),))
    c.take("n1", (0,))
    c.take("n0", (0,))
    assert c.fit(job(7)) == Fit((("n1", tuple(range(1, 8))),))  # n1 had 7 free first
    c.give("n1", (0,))
    c.take("n1", (0,))  # n1 has 7 free again, now after n0
    assert c.fit(job(7)) == Fit((("n0", tuple(range(1, 8))),))


def test_the_gpu_type_is_a_constraint() -> None:
    c = capacity(node("a", 8, "A100"), node("h", 8, "H100"))
    assert c.fit(job(2, gpu_type="H100")) == Fit((("h", (0, 1)),))
    assert c.fit(job(2, gpu_type="")) == Fit((("a", (0, 1)),))  # any type
    refused = no_fit(c.fit(job(2, gpu_type="T4")))
    assert refused.why == WaitReason.of(WaitCode.NO_SUCH_NODE, needs="2×T4")
    assert refused.reason == "needs 2×T4; no registered node has that type"


def kinded(node_id: str, kind: NodeKind, gpu_type: str = "H100") -> NodeSpec:
    return NodeSpec(node_id, gpu_type, tuple(range(4)), 80.0, kind)


def test_a_command_that_must_really_run_goes_to_process_nodes_only() -> None:
    # Filled first by best fit, the simulated and serving nodes would take it otherwise.
    c = capacity(
        kinded("serve", NodeKind.SERVING), kinded("sim", NodeKind.SIMULATED), node("proc", 8)
    )
    assert c.fit(job(2)) == Fit((("proc", (0, 1)),))
    c.take("proc", tuple(range(8)))
    full = c.fit(job(2))
    assert isinstance(full, NoFit) and full.reason.endswith("the largest free block is 0")


def test_a_simulated_run_may_go_to_simulated_nodes_never_to_serving_ones() -> None:
    simulated = job(2, simulated_duration_s=5.0)
    assert simulated.simulated and NodeKind.SIMULATED in simulated.node_kinds
    reporting = job(2, simulated_utilization=0.9)  # says what a run reports, asks for none
    assert not reporting.simulated and reporting.node_kinds == {NodeKind.PROCESS}
    c = capacity(kinded("serve", NodeKind.SERVING), kinded("sim", NodeKind.SIMULATED))
    assert c.fit(simulated) == Fit((("sim", (0, 1)),))
    assert no_fit(c.fit(job(2, simulated_duration_s=5.0, gpu_type="T4"))).reason == (
        "needs 2×T4; no registered node has that type"
    )


def test_a_job_no_node_may_take_is_told_what_the_nodes_of_its_type_run() -> None:
    c = capacity(kinded("serve", NodeKind.SERVING, "T4"), kinded("sim", NodeKind.SIMULATED, "A100"))
    serving_only = no_fit(c.fit(job(1, gpu_type="T4")))
    assert serving_only.why.code is WaitCode.WORKFLOW_NODES_ONLY
    assert serving_only.reason == "needs 1×T4; the T4 nodes take workflows only"
    assert c.fit(job(1, gpu_type="A100", simulated_duration_s=1.0)) == Fit((("sim", (0,)),))
    refused = c.fit(job(1, gpu_type="A100"))
    assert isinstance(refused, NoFit) and "the A100 nodes run no command" in refused.reason
    assert refused.why.code is WaitCode.NO_COMMAND_NODES
    assert not refused.possible
    assert c.schedulable(job(1, gpu_type="A100")) == {}
    assert c.schedulable(job(1, gpu_type="A100", simulated_duration_s=1.0)) == {"sim": 4}


def test_the_gpu_memory_is_a_lower_bound() -> None:
    c = capacity(sized("m40", 8, memory=40.0), sized("m80", 8, memory=80.0))
    assert c.fit(job(1, min_gpu_memory_gib=40)) == Fit((("m40", (0,)),))
    assert c.fit(job(1, min_gpu_memory_gib=41)) == Fit((("m80", (0,)),))
    assert no_fit(c.fit(job(1, min_gpu_memory_gib=96))).reason == (
        "needs 1×GPU with ≥96 GiB; no registered node has that type"
    )


def test_describe_names_gpus_type_and_memory() -> None:
    assert describe(job(4)) == "4×GPU"
    assert describe(job(2, gpu_type="H100", min_gpu_memory_gib=80)) == "2×H100 with ≥80 GiB"


def test_an_empty_cluster_says_no_node_has_registered() -> None:
    fit = Capacity().fit(job(1))
    assert no_fit(fit).reason == "needs 1×GPU; no node has registered yet"
    assert no_fit(fit).why.code is WaitCode.NO_NODES and not no_fit(fit).possible


def test_no_room_now_is_possible_later_and_has_a_stable_reason() -> None:
    c = capacity(node("n0", 8), node("n1", 4))
    c.take("n0", (0, 1, 2, 3, 4))
    c.take("n1", (0,))
    fit = no_fit(c.fit(job(4)))
    assert fit.possible
    assert fit.reason == "needs 4×GPU on one node; the largest free block is 3"
    # The numbers change; the Wait reason does not.
    assert fit.why == WaitReason.of(WaitCode.NO_BLOCK, needs="4×GPU")
    assert fit.why.words() == "needs 4×GPU on one node; waiting for a block that large to free up"


def test_blocked_nodes_are_left_out() -> None:
    c = capacity(node("n0", 8), node("n1", 8))
    c.take("n1", (0, 1, 2, 3))
    assert c.fit(job(2), blocked={"n1"}) == Fit((("n0", (0, 1)),))
    fit = c.fit(job(2), blocked={"n0", "n1"})
    assert isinstance(fit, NoFit) and fit.possible


def test_capacity_counts_free_and_total_gpus_as_work_comes_and_goes() -> None:
    c = capacity(node("n0", 8), node("n1", 4, "A100"))
    assert (c.total_gpus, c.total_free) == (12, 12)
    c.take("n0", (0, 1, 2))
    assert (c.total_free, c.free("n0")) == (9, (3, 4, 5, 6, 7))
    c.give("n0", (1, 9))  # 9 is not a GPU of n0: ignored
    c.give("n0", (1,))  # already free: counted once
    assert (c.total_free, c.free("n0")) == (10, (1, 3, 4, 5, 6, 7))
    c.remove("n1")  # a lost node's GPUs are no longer counted, free or not
    assert (c.total_gpus, c.total_free) == (8, 6)
    assert c.free("n1") == ()
    c.give("n1", (0,))  # a late end on a node that left: nothing comes back
    assert c.total_free == 6


def test_a_node_registered_with_running_tasks_keeps_their_gpus_taken() -> None:
    c = Capacity()
    c.add(node("n0", 8), held={0, 1, 5})
    assert (c.total_gpus, c.total_free, c.free("n0")) == (8, 5, (2, 3, 4, 6, 7))


def test_a_node_registered_again_replaces_its_old_spec() -> None:
    c = capacity(node("n0", 8, "A100"))
    c.add(node("n0", 4, "H100"), held=())
    assert (c.total_gpus, c.total_free) == (4, 4)
    assert isinstance(c.fit(job(1, gpu_type="A100")), NoFit)
    assert c.fit(job(4, gpu_type="H100")) == Fit((("n0", (0, 1, 2, 3)),))


def test_shape_is_the_largest_free_block_node_size_and_whole_free_gpus() -> None:
    c = capacity(node("n0", 8), node("n1", 8), node("n2", 4))
    c.take("n0", (0,))
    assert c.shape() == (8, 8, 8)  # n1 is the only whole free 8-GPU node
    assert c.shape(blocked={"n1"}) == (7, 8, 0)


# -- gangs ---------------------------------------------------------------------


def test_a_gang_larger_than_a_node_takes_whole_free_nodes_by_id() -> None:
    c = capacity(node("n2", 8), node("n0", 8), node("n1", 8))
    c.take("n1", (3,))
    fit = c.fit(job(12))
    assert fit == Fit((("n0", tuple(range(8))), ("n2", (0, 1, 2, 3))))


def test_a_gang_waits_for_enough_whole_nodes() -> None:
    c = capacity(node("n0", 8), node("n1", 8))
    c.take("n1", (7,))
    fit = no_fit(c.fit(job(16)))
    assert fit.possible and fit.reason == "needs 16×GPU on 2 whole nodes; 1 is free"
    assert fit.why.words() == "needs 16×GPU on 2 whole nodes; waiting for them to free up"


def test_a_gang_larger_than_the_cluster_can_never_fit() -> None:
    c = capacity(node("n0", 8), node("n1", 8), node("n2", 8, "A100"))
    fit = c.fit(job(17, gpu_type="H100"))
    assert no_fit(fit).reason == "needs 17×H100; the cluster has only 16 such GPUs"
    assert no_fit(fit).why.code is WaitCode.TOO_FEW_GPUS and not no_fit(fit).possible


def test_a_gang_spans_at_most_the_protocol_limit_of_nodes() -> None:
    c = capacity(*(node(f"n{i:03}", 1) for i in range(MAX_GANG_NODES + 1)))
    fit = c.fit(job(MAX_GANG_NODES + 1))
    assert no_fit(fit).reason == (
        f"needs {MAX_GANG_NODES + 1}×GPU on {MAX_GANG_NODES + 1} whole nodes; "
        f"a job may span at most {MAX_GANG_NODES}"
    )


# -- properties ----------------------------------------------------------------

moves = st.lists(
    st.tuples(
        st.sampled_from(["take", "give", "remove", "add"]),
        st.sampled_from(["n0", "n1", "n2"]),
        st.sets(st.integers(0, 9), max_size=4),
    ),
    max_size=30,
)


@given(moves, st.integers(1, 20), st.sampled_from(["", "H100", "A100"]))
def test_the_counts_match_the_free_lists_and_a_fit_uses_free_gpus_only(
    ops: list[tuple[str, str, set[int]]], gpus: int, gpu_type: str
) -> None:
    c = capacity(node("n0", 8), node("n1", 8), node("n2", 4, "A100"))
    for kind, node_id, indices in ops:
        if kind == "take" and node_id in c.nodes:
            c.take(node_id, [g for g in indices if g in c.free(node_id)])
        elif kind == "give":
            c.give(node_id, indices)
        elif kind == "remove":
            c.remove(node_id)
        elif kind == "add":
            size = 4 if node_id == "n2" else 8
            c.add(node(node_id, size, "A100" if node_id == "n2" else "H100"), held=indices)
    assert c.total_gpus == sum(n.gpu_count for n in c.nodes.values())
    assert c.total_free == sum(len(c.free(n)) for n in c.nodes)
    spec = job(gpus, gpu_type=gpu_type)
    fit = c.fit(spec)
    if isinstance(fit, Fit):
        assert sum(len(g) for _, g in fit.tasks) == gpus
        for node_id, taken in fit.tasks:
            assert set(taken) <= set(c.free(node_id))
            assert not gpu_type or c.nodes[node_id].gpu_type == gpu_type
        if len(fit.tasks) > 1:  # a gang: whole free nodes only
            assert all(len(c.free(n)) == c.nodes[n].gpu_count for n, _ in fit.tasks)
    else:
        free_on_one = [
            len(c.free(n))
            for n, spec_node in c.nodes.items()
            if not gpu_type or spec_node.gpu_type == gpu_type
        ]
        assert gpus > max(free_on_one, default=0)  # nothing that fits was missed
