"""Every skip connection of the papers behind one interface: ``connection(spec, dim, layout, place=...)``.

Importing this package registers the designs; see :mod:`skiplab.connections.spec` for the grammar.
"""

# Import order is the order available_connections() lists the designs in.
from . import expanded, recursive, learned, sas, highway, prenorm, scaled, mixed, deepnorm, peri, admin, hyper, keel, laurel, hybridnorm, ngpt, across  # noqa: F401, I001  (register the designs)
from .across import Across
from .base import (ACROSS, MODEL_NORMS, REGISTRY, Connection, available_connections, check_model_requires,
                   check_token_norms, connection, final_norm, input_norm, iter_connections, parse_spec, recording)
from .place import Place
from .second_order import plain_formulas
from .tie import tie_within_layers  # noqa: F401  (models call it once, at the end of their constructor)
from .norms import EPS, set_norm_eps  # noqa: F401  (a model's own norm eps)
from .spec import ALIASES, Spec, SpecError

__all__ = [
    "ACROSS",
    "ALIASES",
    "Across",
    "MODEL_NORMS",
    "REGISTRY",
    "Connection",
    "Spec",
    "SpecError",
    "available_connections",
    "check_model_requires",
    "check_token_norms",
    "Place",
    "connection",
    "final_norm",
    "input_norm",
    "iter_connections",
    "parse_spec",
    "plain_formulas",
    "recording",
]
