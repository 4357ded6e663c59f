"""The operator-level GPU cost model: per-operator seconds of a deployment from measured GPU profiles."""
from stallfree.engine.simulator.ops.batch import StageBatch
from stallfree.engine.simulator.ops.operator_costs import OperatorCostModel

__all__ = ["OperatorCostModel", "StageBatch"]
