"""Designs across the layers of a stack (one mechanism, :mod:`.base`; one design a file)."""

# Import order is the order available_connections() lists the designs in.
from . import value_res, unet, attn_res  # noqa: F401, I001  (register the designs)
from .attn_res import AttnRes
from .base import AcrossDesign, Across, Run, Stack, not_recomputable, register_across
from .unet import UNet
from .value_res import ValueRes

__all__ = ["AttnRes", "AcrossDesign", "Across", "Run", "Stack", "not_recomputable", "register_across", "UNet", "ValueRes"]
