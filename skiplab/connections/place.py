"""Where a connection sits in its model: the context depth-aware designs initialise from.

Several designs depend on the block's position: DeepNorm's α and β on the depths of the stacks and on
whether the model is encoder-only, decoder-only or encoder-decoder (Wang et al. 2022, Table 1); Admin's ω on
the number of sub-layers before it; Mix-LN on the layer's index; LayerNorm scaling on it too. A model hands
each connection its :class:`Place` once, when it builds it (``connection(spec, dim, place=...)``), so no model
branches on the design it holds.
"""

from __future__ import annotations

from dataclasses import dataclass

STACKS = ("encoder", "decoder")
ROLES = ("attn", "cross", "ffn", "block")


@dataclass(frozen=True)
class Place:
    """Layer ``layer`` (1-based) of the ``stack`` ("encoder" or "decoder") of a model whose stacks have
    ``encoder_layers`` and ``decoder_layers`` layers (0: the model has no such stack), sub-layer ``sublayer``
    (1-based) of that layer's ``sublayers``, named ``role`` ("attn", "cross", "ffn", "block"). A CNN's blocks are
    an encoder-only stack; a GPT's layers a decoder-only one. The default is one block of one layer."""

    layer: int = 1
    stack: str = "encoder"
    encoder_layers: int = 1
    decoder_layers: int = 0
    sublayer: int = 1
    sublayers: int = 1
    role: str = "block"

    def __post_init__(self):
        if self.stack not in STACKS:
            raise ValueError(f"stack must be one of {', '.join(STACKS)}, got {self.stack!r}")
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if min(self.encoder_layers, self.decoder_layers) < 0 or self.layers < 1:
            raise ValueError(f"the {self.stack} stack has {self.layers} layers; a place needs its stack to have one")
        if not 1 <= self.layer <= self.layers:
            raise ValueError(f"layer {self.layer} is outside the {self.stack} stack's 1..{self.layers}")
        if not 1 <= self.sublayer <= self.sublayers:
            raise ValueError(f"sub-layer {self.sublayer} is outside its layer's 1..{self.sublayers}")

    @property
    def layers(self) -> int:
        """The depth of this place's stack."""
        return self.encoder_layers if self.stack == "encoder" else self.decoder_layers

    @property
    def architecture(self) -> str:
        """"encoder-decoder", "encoder-only" or "decoder-only", from which stacks the model has."""
        if self.encoder_layers and self.decoder_layers:
            return "encoder-decoder"
        return "encoder-only" if self.encoder_layers else "decoder-only"

    @property
    def index(self) -> int:
        """This sub-layer's position (1-based) among all the sub-layers of its stack."""
        return (self.layer - 1) * self.sublayers + self.sublayer

    @classmethod
    def decoder_only(cls, layer: int, layers: int, sublayer: int = 1, sublayers: int = 1,
                     role: str = "block") -> Place:
        return cls(layer, "decoder", 0, layers, sublayer, sublayers, role)
