"""The records floor's policy names (analysis orders and counts runs by them) are the scheduler registry's."""
from stallfree.engine import SCHEDULERS
from stallfree.engine.records.policies import POLICIES


def test_the_policy_names_are_the_scheduler_registry_names():
    assert sorted(POLICIES) == SCHEDULERS.names()
    assert len(set(POLICIES)) == len(POLICIES)
