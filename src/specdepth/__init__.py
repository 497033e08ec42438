"""specdepth: adaptive speculative-decoding depth under a shared compute budget."""
from . import _resolvers  # noqa: F401  (registers ${sd.uid:} and ${sd.asset:...})
from .errors import BackendError, ConfigError, PolicyError, SpecdepthError
from .policy import Policy, StepView

__all__ = ["Policy", "StepView", "PolicyError", "ConfigError", "BackendError", "SpecdepthError"]
__version__ = "0.1.0"
