"""PHI token maps: stable, concurrency-safe pseudonymisation with no plaintext at rest.

Public API::

    from nexus_workflows.phi import CATEGORIES, normalize, encode, decode, encode_text

    token = encode("conv-42", "María López", "PERSONA")        # "<<PERSONA_1>>"
    text = encode_text("conv-42", "Soy María, mi cel es 55 1234 5678", spans=[(4, 9, "PERSONA")])
    decode("conv-42", "Hola <<PERSONA_1>>")                    # "Hola María López"
"""

from nexus_workflows.phi.exceptions import (
    InvalidCategory,
    InvalidCode,
    InvalidPhiValue,
    InvalidSpan,
    InvalidText,
    PhiConfigurationError,
    PhiError,
    SurfaceDecryptionError,
    TokenAllocationError,
)
from nexus_workflows.phi.normalization import CATEGORIES, normalize
from nexus_workflows.phi.service import decode, encode, encode_text, find_spans

__all__ = [
    "CATEGORIES",
    "InvalidCategory",
    "InvalidCode",
    "InvalidPhiValue",
    "InvalidSpan",
    "InvalidText",
    "PhiConfigurationError",
    "PhiError",
    "SurfaceDecryptionError",
    "TokenAllocationError",
    "decode",
    "encode",
    "encode_text",
    "find_spans",
    "normalize",
]
