from libs.core.usage import Usage, UsageLedger


def test_a_task_is_charged_once_for_its_gpus_times_its_runtime() -> None:
    ledger = UsageLedger()
    ledger.job("j1", "team-a", 2, allocated=True)
    ledger.started("j1", "j1/0", 100.0)
    ledger.ended("j1/0", 160.0)
    ledger.ended("j1/0", 200.0)  # a redelivered end changes nothing
    assert ledger.usage("team-a") == Usage(allocated_gpu_s=120.0)


def test_unallocated_work_is_recorded_apart() -> None:
    ledger = UsageLedger()
    ledger.job("j1", "team-a", 1, allocated=False)
    ledger.started("j1", "j1/0", 0.0)
    ledger.ended("j1/0", 10.0)
    assert ledger.usage("team-a") == Usage(unallocated_gpu_s=10.0)
