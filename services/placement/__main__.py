"""``python -m services.placement``: run the scheduler service.

Settings: ``QM_PLACEMENT_GROUP`` (consumer group and transactional id, default
``qm-placement``), ``QM_POLICY_FILE`` (YAML of PolicyConfig knobs; auditors
replay with the same file), plus the Kafka settings.
"""

from services.placement.environment import from_env
from services.placement.service import PlacementService
from services.runtime import run_service


def main() -> None:
    run_service("placement", lambda: from_env(PlacementService).run())


if __name__ == "__main__":
    main()
