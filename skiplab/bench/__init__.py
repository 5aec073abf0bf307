"""Benchmarks of the designs and the engine, printed as ratios measured side by side (``skiplab bench``)."""

from .shapes import QUICK, Sizes
from .suite import GROUPS, add_arguments, run
from .timing import Row, interleaved, markdown

__all__ = ["GROUPS", "QUICK", "Row", "Sizes", "add_arguments", "interleaved", "markdown", "run"]
