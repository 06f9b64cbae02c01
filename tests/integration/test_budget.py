"""The budget service: managers change the tree, usage is charged from the log, and
``qm budget usage`` shows owed against delivered GPU-hours to those who may see them."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from qm.v1 import budget_service_pb2 as bs
from qm.v1 import budget_service_pb2_grpc as bs_grpc
from qm.v1 import events_pb2, types_pb2
from qm.v1 import job_service_pb2_grpc as js_grpc

from libs.events import decode, event_type
from tests.integration.conftest import eventually, read_topic, wait_for_end
from tests.integration.stack import Stack
from tests.integration.test_cli_scripting import qm
from tests.integration.test_job_lifecycle import submit


@pytest.fixture(scope="module")
def budget(stack: Stack) -> bs_grpc.BudgetServiceStub:
    return bs_grpc.BudgetServiceStub(stack.budget_channel())


def test_only_managers_change_the_tree_and_every_change_is_an_event(
    stack: Stack, budget: bs_grpc.BudgetServiceStub
) -> None:
    node = types_pb2.BudgetNode(name="nlp", parent="lab", weight=55, members=["bob", "alice"])
    with pytest.raises(grpc.RpcError) as denied:
        budget.SetAllocation(bs.SetAllocationRequest(node=node), metadata=stack.auth("dana"))
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    bad = types_pb2.BudgetNode(name="nlp", parent="lab", weight=0)
    with pytest.raises(grpc.RpcError) as invalid:
        budget.SetAllocation(bs.SetAllocationRequest(node=bad), metadata=stack.auth("carol"))
    assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "nlp: weight must be > 0" in invalid.value.details()
    tree = budget.SetAllocation(
        bs.SetAllocationRequest(node=node), metadata=stack.auth("carol")
    ).tree

    def logged() -> events_pb2.BudgetChanged | None:
        """The change, once the log shows it (a commit can be acknowledged before a
        reader sees it)."""
        changes = [
            env.budget_changed
            for env in (decode(r.value) for r in read_topic(stack, "events"))
            if event_type(env) == "budget_changed"
        ]
        return changes[-1] if changes and changes[-1].tree.version == tree.version else None

    assert eventually(logged, what="the change on the log").changed_by == "carol"


def test_allocated_work_is_charged(
    stack: Stack, jobs: js_grpc.JobServiceStub, budget: bs_grpc.BudgetServiceStub
) -> None:
    job_id = submit(stack, jobs, gpus=2, min_runtime=Duration(seconds=60), command=["sleep", "0.5"])
    assert wait_for_end(stack, jobs, job_id).state == types_pb2.JOB_STATE_FINISHED

    def charged() -> float:
        balances = budget.GetBalances(bs.GetBalancesRequest(), metadata=stack.auth("alice"))
        return sum(b.gpu_seconds for b in balances.balances if b.allocation == "vision")

    assert eventually(charged, what="a charge for vision") >= 2 * 0.4


def test_usage_shows_owed_and_delivered_hours_to_those_who_may_see_them(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    job_id = submit(stack, jobs, gpus=2, min_runtime=Duration(seconds=60), command=["sleep", "1"])
    assert wait_for_end(stack, jobs, job_id).state == types_pb2.JOB_STATE_FINISHED

    def usage(user: str) -> dict[str, dict[str, Any]]:
        document = json.loads(qm(stack, user, "budget", "usage", "-o", "json"))
        return {level["allocation"]: level for level in document["allocations"]}

    def vision_delivered() -> dict[str, Any] | None:
        vision = usage("alice")["vision"]
        return vision if vision["allocated_gpu_hours"] >= 2 * 0.8 / 3600 else None

    vision = eventually(vision_delivered, what="vision's job delivered in qm budget usage")
    assert vision["owed_gpu_hours"] > 0 and vision["delivered_pct"] > 0
    assert vision["entitlement"] == pytest.approx(0.6, abs=0.1)
    # alice is a member of both teams; bob of nlp only; carol manages the root.
    assert usage("alice").keys() == {"vision", "nlp"}
    assert usage("bob").keys() == {"nlp"}
    assert usage("carol").keys() == {"vision", "nlp"}
    assert usage("mallory") == {}
    table = qm(stack, "alice", "budget", "usage")
    assert "DELIVERED/OWED" in table and "vision" in table


def test_budget_set_says_what_changed_and_a_no_op_changes_nothing(
    stack: Stack, budget: bs_grpc.BudgetServiceStub
) -> None:
    def nlp() -> tuple[int, types_pb2.BudgetNode]:
        tree = budget.GetTree(bs.GetTreeRequest(), metadata=stack.auth("carol")).tree
        return tree.version, next(n for n in tree.nodes if n.name == "nlp")

    version, before = nlp()
    member = before.members[0]
    for flags in (["--add-member", member], ["--weight", f"{before.weight:g}"]):
        said = qm(stack, "carol", "budget", "set", "nlp", *flags)
        assert said.startswith("no change: nlp is already so"), said
        assert nlp()[0] == version
    said = qm(stack, "carol", "budget", "set", "nlp", "--weight", "41", "--add-member", "erin")
    assert said.splitlines() == [
        f"changed nlp; budget tree version {version} -> {version + 1}",
        f"  weight: {before.weight:g} -> 41",
        "  members: +erin",
    ]
    assert nlp()[0] == version + 1
