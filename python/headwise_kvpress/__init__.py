"""headwise policies in kvpress pipelines: `HeadwisePress("policy.yaml")` (docs/keep-rules.md,
"Serving snap heads in kvpress")."""
from .press import HeadwisePress

__all__ = ["HeadwisePress"]
