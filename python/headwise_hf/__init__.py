"""headwise policies in Hugging Face transformers: `HeadwiseCache.from_policy("policy.yaml", model)`."""
from .attention import headwise_attention_forward, install, register
from .cache import HeadwiseCache, HeadwiseLayer, held_positions
from .policy import Policy, PolicyError, head_slots, read_policy
from .selection import keep_indices, snap_choice

__all__ = ["HeadwiseCache", "HeadwiseLayer", "Policy", "PolicyError", "read_policy", "head_slots",
           "headwise_attention_forward", "install", "register", "held_positions", "keep_indices", "snap_choice"]
# The one version number of headwise (python/pyproject.toml reads it; equal to CMakeLists.txt's).
__version__ = "0.1.0"
