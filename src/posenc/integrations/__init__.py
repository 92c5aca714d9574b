"""Bridges to other libraries' configs and models (their packages imported only when needed)."""

from posenc.integrations.transformers import rotary_from_config, scaling_from_transformers

__all__ = ["rotary_from_config", "scaling_from_transformers"]
