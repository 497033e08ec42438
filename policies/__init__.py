"""Built-in depth policies (importable as `specdepth.policies`), one small file each."""
from .bandit import Bandit
from .batch_scaled import BatchScaled
from .batch_table import BatchTable
from .confidence import ConfidenceThreshold
from .disable_by_batch import DisableByBatch
from .ema import EMA
from .fixed import FixedDepth
from .goodput import Goodput
from .heuristic import Heuristic
from .oracle import Oracle
from .oracle_causal import OracleCausal
from .oracle_expected import OracleExpected
from .tree_confidence import TreeConfidence
from .tree_fixed import TreeFixed
from .tree_goodput import TreeGoodput
from .tree_oracle import TreeOracle

__all__ = ["FixedDepth", "BatchScaled", "ConfidenceThreshold", "DisableByBatch", "BatchTable", "Heuristic",
           "EMA", "Goodput", "Oracle", "OracleExpected", "OracleCausal",
           "Bandit", "TreeFixed", "TreeGoodput", "TreeConfidence", "TreeOracle"]
