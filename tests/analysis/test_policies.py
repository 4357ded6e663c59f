"""analysis orders and counts runs by policy without importing the engine: its list is the registry's."""
from stallfree.analysis.load import POLICIES
from stallfree.engine import SCHEDULERS


def test_the_analysis_policies_are_the_scheduler_registry_names():
    assert sorted(POLICIES) == SCHEDULERS.names()
    assert len(set(POLICIES)) == len(POLICIES)
