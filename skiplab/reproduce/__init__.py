"""Every table of the papers as data, runnable at smoke, cpu and paper scale (``skiplab reproduce``)."""

from .papers import TABLES, table
from .command import add_arguments, listing, parse_tables, plan, reproduce, resolve
from .scales import BY_NAME as SCALES, GPU_BASIS, scale
from .tables import Cell, Run, Table

__all__ = ["TABLES", "SCALES", "GPU_BASIS", "Cell", "Run", "Table", "listing", "parse_tables", "plan", "reproduce",
           "resolve", "scale", "table"]
