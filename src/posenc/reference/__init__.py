"""The float64 NumPy oracle of every formula in posenc.

Written for clarity, not speed: loops and plain formulas straight from the papers.
Every torch path is tested against these functions. This package imports NumPy
only, never torch.
"""

from posenc.reference.index import index_table
from posenc.reference.learned import resample_table
from posenc.reference.sinusoidal import sinusoidal_table, sinusoidal_table_nd

# rotary
from posenc.reference.rotary import (
    apply_rotary,
    axial_frequencies,
    rotary_angles,
    rotary_qk,
    sectioned_angles,
    xpos_scale,
)
from posenc.reference.rotary_frequencies import rope_frequencies

# bias
from posenc.reference.bias import (
    alibi_bias,
    alibi_slopes,
    fire_bias,
    fire_normalized_distance,
    kerple_bias,
    shaw_relative_logits,
    shaw_relative_values,
    t5_relative_bias,
    t5_relative_bucket,
)

# attention
from posenc.reference.attention import attention
from posenc.reference.remap import (
    remapped_attention_reference,
    self_extend_positions,
    string_positions,
)

# contextual
from posenc.reference.contextual import (
    cope_attention,
    cope_bias,
    cope_positions,
    fox_attention,
    fox_bias,
)

# The names by family, in the order of the imports above.
__all__ = ["index_table", "resample_table", "sinusoidal_table", "sinusoidal_table_nd"]
__all__ += ["apply_rotary", "axial_frequencies", "rotary_angles", "rotary_qk", "sectioned_angles"]
__all__ += ["xpos_scale", "rope_frequencies"]
__all__ += ["alibi_bias", "alibi_slopes", "fire_bias", "fire_normalized_distance", "kerple_bias"]
__all__ += ["shaw_relative_logits", "shaw_relative_values"]
__all__ += ["t5_relative_bias", "t5_relative_bucket"]
__all__ += ["attention"]
__all__ += ["remapped_attention_reference", "self_extend_positions", "string_positions"]
__all__ += ["cope_attention", "cope_bias", "cope_positions", "fox_attention", "fox_bias"]
