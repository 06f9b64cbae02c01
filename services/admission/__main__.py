"""``python -m services.admission``: the gRPC front door (JobService, ClusterService).

Settings: ``QM_ADMISSION_ADDR`` (listen, default 127.0.0.1:50051),
``QM_BUDGET_TARGET`` (default 127.0.0.1:50052), ``QM_PROJECTOR_URL`` (default
http://127.0.0.1:6066), ``QM_MAX_GPUS``, ``QM_MAX_MIN_RUNTIME_S``,
``QM_GPU_TYPES`` (comma-separated; empty accepts any), ``QM_GPU_MEMORY_MB`` (the
largest GPU a workflow's model may need; unset: the largest GPU of the registered
nodes, as the projector lists them), plus Kafka and auth.
"""

from __future__ import annotations

import asyncio
import logging
import os

from qm.v1 import (
    cluster_service_pb2,
    cluster_service_pb2_grpc,
    job_service_pb2,
    job_service_pb2_grpc,
)

from libs.auth import issue_token, load_secret
from libs.bus import EventProducer, KafkaSettings, load_topic_config
from libs.core import Limits
from libs.telemetry import setup_tracing
from services.admission.budget_view import BudgetView
from services.admission.explainer import Explainer
from services.admission.follower import Follower
from services.admission.requests import RequestLog
from services.admission.servicer import ClusterServicer, JobServicer
from services.grpc_server import start_server
from services.policy_file import policy_from_env
from services.projector.client import ProjectorClient
from services.runtime import configure_logging, run_until_signalled

log = logging.getLogger("admission")


def limits_from_env() -> Limits:
    defaults = Limits()
    types = os.environ.get("QM_GPU_TYPES", "")
    return Limits(
        max_gpus=int(os.environ.get("QM_MAX_GPUS", defaults.max_gpus)),
        max_min_runtime_s=int(os.environ.get("QM_MAX_MIN_RUNTIME_S", defaults.max_min_runtime_s)),
        gpu_types=frozenset(t for t in types.split(",") if t),
        gpu_memory_mb=float(os.environ.get("QM_GPU_MEMORY_MB") or defaults.gpu_memory_mb),
    )


async def serve() -> None:
    settings, topics, secret = KafkaSettings.from_env(), load_topic_config(), load_secret()
    producer = EventProducer(settings, client_id="admission")
    projector = ProjectorClient(os.environ.get("QM_PROJECTOR_URL", "http://127.0.0.1:6066"))
    budget = BudgetView(
        os.environ.get("QM_BUDGET_TARGET", "127.0.0.1:50052"), issue_token("svc-admission", secret)
    )
    explainer = Explainer(policy_from_env())
    requests = RequestLog()
    follower = Follower(settings, topics.events.name, [explainer.apply, requests.apply])
    jobs = JobServicer(
        producer=producer,
        topic=topics.events.name,
        budget=budget,
        projector=projector,
        limits=limits_from_env(),
        secret=secret,
        explainer=explainer,
        requests=requests,
        follower=follower,
    )
    cluster = ClusterServicer(projector=projector, secret=secret)
    await producer.start()
    await follower.start()
    try:
        server, port = await start_server(
            os.environ.get("QM_ADMISSION_ADDR", "127.0.0.1:50051"),
            [
                lambda s: job_service_pb2_grpc.add_JobServiceServicer_to_server(jobs, s),
                lambda s: cluster_service_pb2_grpc.add_ClusterServiceServicer_to_server(cluster, s),
            ],
            [
                job_service_pb2.DESCRIPTOR.services_by_name["JobService"].full_name,
                cluster_service_pb2.DESCRIPTOR.services_by_name["ClusterService"].full_name,
            ],
        )
        log.info("serving JobService and ClusterService on port %d", port)
        try:
            await server.wait_for_termination()
        finally:
            await server.stop(grace=2)
    finally:
        await follower.stop()
        await producer.stop()
        await projector.close()
        await budget.close()


def main() -> None:
    configure_logging("admission")
    setup_tracing("admission")
    asyncio.run(run_until_signalled(serve()))


if __name__ == "__main__":
    main()
