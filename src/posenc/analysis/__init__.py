"""What an encoding does, measured: properties, the classic demonstrations, and summaries.

Every function takes an encoding as a module, a registry name or a config dict (names are
built with :data:`DEFAULT_ARGS` for the arguments a class requires) and returns a frozen
dataclass of numbers with ``to_dict()`` for JSON.

>>> from posenc import analysis
>>> analysis.shift_structure("sinusoidal").dot_depends_only_on_offset
True
"""

from posenc.analysis._encodings import DEFAULT_ARGS, resolve_encoding
from posenc.analysis.demonstrations import OrderSensitivity, order_sensitivity
from posenc.analysis.properties import Boundedness, Uniqueness, boundedness, uniqueness
from posenc.analysis.relative import Decay, ShiftStructure, decay, roformer_bound, shift_structure
from posenc.analysis.summary import SUMMARY_COLUMNS, Properties, properties

__all__ = [
    "DEFAULT_ARGS",
    "SUMMARY_COLUMNS",
    "Boundedness",
    "Decay",
    "OrderSensitivity",
    "Properties",
    "ShiftStructure",
    "Uniqueness",
    "boundedness",
    "decay",
    "order_sensitivity",
    "properties",
    "resolve_encoding",
    "roformer_bound",
    "shift_structure",
    "uniqueness",
]
