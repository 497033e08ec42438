"""Built-in depth policies (importable as `specdepth.policies`), one small file each."""
from .batch_scaled import BatchScaled
from .confidence import ConfidenceThreshold
from .fixed import FixedDepth

__all__ = ["FixedDepth", "BatchScaled", "ConfidenceThreshold"]
