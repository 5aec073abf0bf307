"""Models that take any connection, a second family without them, and their named presets.

    preact_resnet   PreAct-ResNet for images (a connection on every block)
    incremental     the incremental decoding interface both generating families keep (start, step, select)
    seq2seq         the encoder-decoder shell: embedding, positions, tied output, incremental decoding
    linear          the translation families' linear layers: Xavier-uniform, stacked ones slice by slice
    transformer     the residual Transformer family (a connection on every sub-layer)
    captioner       the Transformer captioner: an image trunk or features before the residual Transformer
    gpt             the decoder-only language model family (a connection on every sub-layer)
    dwlstm          the depth-wise LSTM Transformer family (no residual connections)
    presets         presets as data, the model spec ``name(field=value, ...)``, ``build_model``
    linear_ce       the output layer fused with its cross-entropy (no (tokens, vocabulary) logits kept)
"""

from __future__ import annotations

from .dwlstm import DepthWiseLSTMConfig, DepthWiseLSTMTransformer
from .gpt import GPT, GPTConfig
from .preact_resnet import PreActBlock, PreActResNet, PreActResNetConfig
from .presets import (
    FAMILIES,
    PRESETS,
    build_model,
    caption_families,
    family_of,
    format_model_spec,
    lm_families,
    model_config,
    model_from_checkpoint,
    options_of,
    parse_model_spec,
    seq2seq_families,
    with_options,
)
from .seq2seq import DecoderState, EncoderDecoder, Memory, Seq2SeqConfig
from .transformer import Transformer, TransformerConfig
from .captioner import Captioner, CaptionerConfig

__all__ = ["FAMILIES", "Captioner", "CaptionerConfig", "caption_families", "GPT", "GPTConfig", "PRESETS", "DecoderState", "DepthWiseLSTMConfig", "DepthWiseLSTMTransformer", "EncoderDecoder",
           "Memory", "PreActBlock", "PreActResNet", "PreActResNetConfig", "Seq2SeqConfig", "Transformer",
           "TransformerConfig", "build_model", "family_of", "format_model_spec", "lm_families", "model_config", "model_from_checkpoint", "options_of",
           "parse_model_spec", "seq2seq_families", "with_options"]
