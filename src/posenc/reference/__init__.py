"""The float64 NumPy oracle of every formula in posenc.

Written for clarity, not speed: loops and plain formulas straight from the papers.
Every torch path is tested against these functions. This package imports NumPy
only, never torch.
"""

from posenc.reference.sinusoidal import sinusoidal_table, sinusoidal_table_nd

# rotary
from posenc.reference.rotary_frequencies import rope_frequencies

# bias

# attention

__all__ = [
    "sinusoidal_table",
    "sinusoidal_table_nd",
    # rotary
    "rope_frequencies",
    # bias
    # attention
]
