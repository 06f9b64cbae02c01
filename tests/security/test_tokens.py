"""Attacks on the front door, against the real admission and budget servers: tokens
that are expired, for another audience or issuer, unsigned, signed by another
installation, re-signed for another user, HMAC-signed with the public key, or signed by
a service's own key for a user are all refused (UNAUTHENTICATED), while a good token of
the same user is answered."""

from __future__ import annotations

import time
from dataclasses import replace

import grpc
import jwt
import pytest
from qm.v1 import budget_service_pb2 as bs
from qm.v1 import budget_service_pb2_grpc as bs_grpc
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc
from qm.v1 import types_pb2

from libs.auth import SigningKey, issue_token
from libs.auth.tokens import read_private_key
from services.grpc_server import bearer
from tests.forgery import hmac_token
from tests.integration.stack import Stack


def bad_tokens(signer: SigningKey, console: SigningKey) -> dict[str, str]:
    """``signer``: the user-token issuer's key; ``console``: the console's own."""
    now = int(time.time())
    claims = {"sub": "carol", "iss": signer.issuer, "aud": signer.audience, "iat": now,
              "exp": now + 600}  # fmt: skip
    header, _, signature = issue_token("alice", signer).split(".")
    carol = jwt.encode(claims, b"x" * 32).split(".")[1]
    public = signer.public().pem().encode()
    return {
        "expired": issue_token("carol", signer, ttl_s=60, now=now - 3600),
        "another audience": issue_token("carol", replace(signer, audience="billing")),
        "another issuer": issue_token("carol", replace(signer, issuer="mallory")),
        "unsigned (alg none)": jwt.encode(claims, "", algorithm="none"),
        "another installation": issue_token("carol", SigningKey.generate()),
        "alice's signature on carol's claims": f"{header}.{carol}.{signature}",
        "no expiry": jwt.encode(
            {k: v for k, v in claims.items() if k != "exp"}, signer.private_key,
            algorithm="EdDSA", headers={"kid": signer.kid},
        ),
        "HMAC with the public key": hmac_token(claims, public, signer.kid),
        "the console's key, for a user": issue_token("carol", console),
    }  # fmt: skip


CASES = list(bad_tokens(SigningKey.generate(), SigningKey.generate()))


def stack_tokens(stack: Stack) -> dict[str, str]:
    console = SigningKey(read_private_key(stack.auth_dir / "console.key"))
    return bad_tokens(stack.signer, console)


@pytest.mark.parametrize("case", CASES)
def test_a_bad_token_cannot_change_the_budget_tree(front_door: Stack, case: str) -> None:
    """carol manages the root: with a good token this change would be accepted."""
    stack = front_door
    budget = bs_grpc.BudgetServiceStub(stack.budget_channel())
    node = types_pb2.BudgetNode(name="heist", parent="lab", weight=99, members=["mallory"])
    with pytest.raises(grpc.RpcError) as refused:
        budget.SetAllocation(
            bs.SetAllocationRequest(node=node), metadata=bearer(stack_tokens(stack)[case])
        )
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value.details()
    tree = budget.GetTree(bs.GetTreeRequest(), metadata=stack.auth("carol")).tree
    assert "heist" not in {n.name for n in tree.nodes}


@pytest.mark.parametrize("case", CASES)
def test_a_bad_token_cannot_submit_or_list(front_door: Stack, case: str) -> None:
    stack = front_door
    jobs = js_grpc.JobServiceStub(stack.channel())
    token = bearer(stack_tokens(stack)[case])
    spec = types_pb2.JobSpec(gpus=1, allocation="nlp", command=["true"])
    for call, request in (
        (jobs.SubmitJob, js.SubmitJobRequest(spec=spec)),
        (jobs.ListJobs, js.ListJobsRequest()),
    ):
        with pytest.raises(grpc.RpcError) as refused:
            call(request, metadata=token, timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    jobs.ListJobs(js.ListJobsRequest(), metadata=stack.auth("alice"), timeout=10)  # answered
