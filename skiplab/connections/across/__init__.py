"""Designs across the layers of a stack (one mechanism, :mod:`.base`; one design a file)."""

# Import order is the order available_connections() lists the designs in.
from . import value_res, unet, denseformer, mudd, attn_res, scalars, backout  # noqa: F401, I001  (register the designs)
from .attn_res import AttnRes
from .backout import Backout
from .base import (AcrossDesign, Across, Run, Stack, check_stack, not_recomputable, recording_mixes,
                   register_across)
from .denseformer import DenseFormer
from .mudd import MUDD
from .scalars import Scalars
from .unet import UNet
from .value_res import ValueRes

__all__ = ["AcrossDesign", "Across", "Run", "Stack", "check_stack", "not_recomputable", "recording_mixes",
           "register_across", "AttnRes", "Backout", "DenseFormer", "MUDD", "Scalars", "UNet", "ValueRes"]
