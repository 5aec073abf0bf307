"""Designs across the layers of a stack (one mechanism, :mod:`.base`; one design a file)."""

# Import order is the order available_connections() lists the designs in.
from . import value_res, unet, denseformer, mudd  # noqa: F401, I001  (register the designs)
from .base import AcrossDesign, Across, Run, Stack, not_recomputable, recording_mixes, register_across
from .denseformer import DenseFormer
from .mudd import MUDD
from .unet import UNet
from .value_res import ValueRes

__all__ = ["AcrossDesign", "Across", "Run", "Stack", "not_recomputable", "recording_mixes", "register_across", "UNet",
           "ValueRes", "DenseFormer", "MUDD"]
