"""Bridges to other libraries' configs and models (their packages imported only when needed)."""

from posenc.integrations.transformers import (
    patch,
    rotary_from_config,
    scaling_from_transformers,
    unpatch,
)

__all__ = ["patch", "rotary_from_config", "scaling_from_transformers", "unpatch"]
