"""The budget service: managers change the tree, usage is charged from the log."""

from __future__ import annotations

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
