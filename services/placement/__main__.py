"""``python -m services.placement``: run the scheduler service.

Settings: ``QM_PLACEMENT_GROUP`` (consumer group and transactional id, default
``qm-placement``), ``QM_POLICY_FILE`` (YAML of PolicyConfig knobs; auditors
replay with the same file), the metrics settings of ``services.metrics_http`` (and the
auth keys that check who reads them), plus the Kafka settings.
"""

from services.metrics_http import metrics_keys, metrics_server
from services.placement.environment import from_env
from services.placement.service import PlacementService
from services.runtime import run_service


async def serve() -> None:
    service = from_env(PlacementService)
    async with metrics_server("placement", metrics_keys(), lambda: service.ready):
        await service.run()


def main() -> None:
    run_service("placement", serve)


if __name__ == "__main__":
    main()
