"""The planner's tests plan for GPUs unless a test says otherwise: the test-wide
DS_ACCELERATOR=cpu (tests/conftest.py) would make every plan one for CPU ranks
(plan/machine.py: ranks_on_cpu). A test of CPU ranks sets it again."""
import pytest


@pytest.fixture(autouse=True)
def plans_for_gpus(monkeypatch):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
