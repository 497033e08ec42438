"""specdepth: adaptive speculative-decoding depth under a shared compute budget."""
from . import _resolvers  # noqa: F401  (registers the config resolvers ${sd.uid:}, ${sd.asset:...}, ${sd.run_id:...})
from .errors import BackendError, ConfigError, PluginError, PolicyError, SpecdepthError
from .policy import Policy, StepView

__all__ = ["Policy", "StepView", "PolicyError", "PluginError", "ConfigError", "BackendError", "SpecdepthError"]
__version__ = "0.1.0"
