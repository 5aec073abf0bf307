"""skiplab: residual (skip) connections with normalisation, behind one interface.

>>> import skiplab
>>> conn = skiplab.connection("2rSkip+LN", dim=512)
>>> y = conn(x, branch)            # y = LN(x + LN(x + branch(x)))
"""

from .connections import (
    Connection,
    Place,
    available_connections,
    connection,
    final_norm,
    input_norm,
    iter_connections,
    parse_spec,
    plain_formulas,
    recording,
)

__version__ = "0.1.0"
__all__ = ["Connection", "Place", "available_connections", "connection", "final_norm", "input_norm", "iter_connections",
           "parse_spec", "plain_formulas", "recording", "__version__"]
