"""``python -m services.admission``: the gRPC front door (JobService, ClusterService).

Settings: ``QM_ADMISSION_ADDR`` (listen, default 127.0.0.1:50051),
``QM_BUDGET_TARGET`` (default 127.0.0.1:50052), ``QM_PROJECTOR_URL`` (default
http://127.0.0.1:6066), ``QM_MAX_GPUS``, ``QM_MAX_MIN_RUNTIME_S``,
``QM_GPU_TYPES`` (comma-separated GPU types accepted before any node of them has
registered; the types the nodes offer are accepted anyway), ``QM_GPU_MEMORY_MB`` (the
largest GPU a workflow's model may need; unset: the largest GPU of the registered
nodes, as the projector lists them), ``QM_OPERATORS`` (comma-separated users who see
every job), ``QM_NODE_LOG_TLS_NAME`` (the name node agents' certificates carry, when
admission reaches them at addresses those do not name, as pod IPs), the metrics settings
of ``services.metrics_http``, plus Kafka and auth: ``QM_AUTH_SIGNING_KEY_FILE`` is
admission's own key, which may sign only its identities (``libs.auth.tokens``).
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from pydantic import BeforeValidator, Field
from qm.v1 import (
    cluster_service_pb2,
    cluster_service_pb2_grpc,
    job_service_pb2,
    job_service_pb2_grpc,
)

from libs.auth import Keys, ServiceToken, load_keys, load_service_signer
from libs.auth.tokens import SERVICE_SUBJECTS
from libs.bus import EventProducer, KafkaBus, KafkaSettings, Topics, load_topic_config
from libs.config.env import Address, EnvSettings
from libs.core import Limits
from libs.core.limits import MAX_GPUS
from libs.trust import Gate, SigningKey
from services.admission.budget_view import BudgetView
from services.admission.explainer import Explainer
from services.admission.follower import Follower
from services.admission.node_keys import NodeApprovals
from services.admission.requests import RequestLog
from services.admission.servicer import ClusterServicer, JobServicer
from services.admission.tasklogs import READER, TaskLogReader
from services.grpc_server import serve_until_cancelled
from services.metrics_http import MetricsSettings, metrics_server
from services.policy_file import policy_from_env
from services.projector.client import ProjectorClient
from services.runtime import cancel_and_wait, run_service
from services.tls import TlsSettings
from services.trust import gate_from_env, signing_key_from_env


def _types(value: object) -> object:
    if isinstance(value, str):
        return frozenset(name.strip() for name in value.split(",") if name.strip())
    return value


class AdmissionSettings(EnvSettings):
    address: Address = Field("127.0.0.1:50051", alias="QM_ADMISSION_ADDR")
    budget_target: Address = Field("127.0.0.1:50052", alias="QM_BUDGET_TARGET")
    projector_url: str = Field("http://127.0.0.1:6066", min_length=1, alias="QM_PROJECTOR_URL")
    node_log_tls_name: str | None = Field(None, alias="QM_NODE_LOG_TLS_NAME")
    max_gpus: int = Field(Limits().max_gpus, ge=1, le=MAX_GPUS, alias="QM_MAX_GPUS")
    max_min_runtime_s: int = Field(Limits().max_min_runtime_s, ge=0, alias="QM_MAX_MIN_RUNTIME_S")
    # Accepted before their nodes register (an operator's word that they are coming).
    gpu_types: Annotated[frozenset[str], BeforeValidator(_types)] = Field(
        frozenset(), alias="QM_GPU_TYPES"
    )
    gpu_memory_mb: float | None = Field(None, gt=0, alias="QM_GPU_MEMORY_MB")
    # Users who see every job without managing the budget (the root's managers see them too).
    operators: Annotated[frozenset[str], BeforeValidator(_types)] = Field(
        frozenset(), alias="QM_OPERATORS"
    )

    @property
    def limits(self) -> Limits:
        memory = self.gpu_memory_mb if self.gpu_memory_mb is not None else Limits().gpu_memory_mb
        return Limits(self.max_gpus, self.max_min_runtime_s, self.gpu_types, memory)


async def serve() -> None:
    settings, topics, keys = KafkaSettings.from_env(), load_topic_config(), load_keys()
    own, metrics = AdmissionSettings.from_env(), MetricsSettings.from_env()
    # It signs what it writes, and checks what it folds as placement does.
    sealer, gate = signing_key_from_env("admission"), gate_from_env()
    serving = asyncio.Event()
    async with metrics_server("admission", keys, serving.is_set, metrics):
        await _serve(settings, topics, keys, own, sealer, gate, serving)


async def _serve(
    settings: KafkaSettings,
    topics: Topics,
    keys: Keys,
    own: AdmissionSettings,
    sealer: SigningKey,
    gate: Gate,
    serving: asyncio.Event,
) -> None:
    bus = KafkaBus(settings)
    producer = EventProducer(bus, client_id="admission", sealer=sealer)
    signer = load_service_signer(keys, SERVICE_SUBJECTS["admission"])
    token = ServiceToken("svc-admission", signer)
    projector = ProjectorClient(own.projector_url, token=token)
    tls = TlsSettings.from_env()
    budget = BudgetView(own.budget_target, token, tls)
    logs = TaskLogReader(ServiceToken(READER, signer), tls, own.node_log_tls_name)
    explainer = Explainer(policy_from_env(), gate)
    requests, approvals = RequestLog(gate=gate), NodeApprovals(gate=gate)
    views = [explainer.apply, requests.apply, approvals.apply]
    follower = Follower(bus, topics.events.name, views)
    jobs = JobServicer(
        producer=producer,
        topic=topics.events.name,
        budget=budget,
        projector=projector,
        limits=own.limits,
        keys=keys,
        explainer=explainer,
        requests=requests,
        follower=follower,
        logs=logs,
        operators=own.operators,
    )
    cluster = ClusterServicer(
        projector=projector,
        keys=keys,
        access=jobs.access,
        journal=jobs.journal,
        approvals=approvals,
        follower=follower,
    )
    await producer.start()
    await follower.start()
    sweeping = asyncio.create_task(jobs.submissions.sweep())
    try:
        await serve_until_cancelled(
            own.address,
            [
                lambda s: job_service_pb2_grpc.add_JobServiceServicer_to_server(jobs, s),
                lambda s: cluster_service_pb2_grpc.add_ClusterServiceServicer_to_server(cluster, s),
            ],
            [
                job_service_pb2.DESCRIPTOR.services_by_name["JobService"].full_name,
                cluster_service_pb2.DESCRIPTOR.services_by_name["ClusterService"].full_name,
            ],
            serving,
        )
    finally:
        await cancel_and_wait(sweeping)
        await follower.stop()
        await producer.stop()
        await projector.close()
        await budget.close()
        await logs.close()


def main() -> None:
    run_service("admission", serve)


if __name__ == "__main__":
    main()
