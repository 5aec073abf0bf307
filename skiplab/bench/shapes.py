"""What ``skiplab bench`` measures: the sizes (the papers' or, with ``--quick``, tiny ones), the designs each group
times, and models and batches of those sizes."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .steps import MTBatch, build

IMAGE_DESIGNS = ("1xSkip", "2xSkip+LN", "2rSkip+LN", "wSkip+LN", "SAS", "Highway")
MT_DESIGNS = ("PostLN", "PreLN", "2rSkip+LN", "SAS")
LM_DESIGNS = ("PreLN", "PostLN", "PreRMS", "2rSkip+LN", "SAS", "ReZero", "LayerScale", "LNS", "MixLN", "DeepNorm", "Admin",
              "PeriLN", "PreDyT", "HC", "HC(kind=static)", "mHC", "PreLN+ValueRes", "PreLN+UNet")
HYPER_DESIGNS = {"HC(n=4)": "1.10", "mHC(n=4)": "1.15"}  # HC in its default, dynamic form; goals / PreLN
# the designs that mix or scale across depth, each with its goal / PreLN (issue: Block forms and scalars 1.05x,
# dynamic or full mixes 1.15x)
DEPTH_DESIGNS: dict[str, str] = {"PreLN+DenseFormer": "1.05", "PreLN+AttnRes(block=2)": "1.05", "PreLN+Scalars": "1.05",
                                 "PreLN+Backout": "1.05", "LAuReL(form=lr)": "1.05", "LAuReL(form=pa)": "1.05",
                                 "Keel": "1.05", "PreLN+MUDD": "1.15", "PreLN+AttnRes": "1.15", "nGPT": "1.15"}


CAPTION_DESIGNS = ("PostLN", "SAS", "2rSkip+LN")



@dataclass(frozen=True)
class Sizes:
    """The shapes a run measures: the papers' (full) or tiny ones (quick)."""

    image_depth: int = 56
    image_batch: int = 128
    image_hw: int = 32
    mt_model: str = "transformer-small"
    mt_overrides: tuple[tuple[str, int], ...] = ()
    mt_rows: int = 128
    mt_len: int = 30  # 128 x 30 ~ 4k tokens a side, the recipe's batch
    vocab: int = 8000
    beam_sentences: int = 16
    beam_len: int = 20
    compile_depth: int = 20
    compile_backend: str = "inductor"  # quick: aot_eager, the same tracing without generating kernels
    compile_dynamic: bool = True  # MT batches vary in shape; quick traces one static shape (seconds, not a minute)
    lm_model: str = "gpt-small"
    lm_overrides: tuple[tuple[str, int], ...] = ()
    lm_rows: int = 16  # 16 x 256 = 4k tokens a step
    lm_vocab: int = 257  # bytes
    lm_new_tokens: int = 256
    matmul_n: int = 1024
    add_elements: int = 1 << 24
    norm_rows: int = 4096
    norm_dim: int = 512
    process_steps: int = 6
    hyper_widths: tuple[int, ...] = (256, 768)  # gpt-small's width and GPT-2 small's (heads of 64, MLP 4d)
    hyper_layers: int = 4
    hyper_rows: int = 8  # 8 x 256 tokens a step
    caption_model: str = "captioner-small"
    caption_overrides: tuple[tuple[str, int], ...] = ()
    caption_rows: int = 50  # the cpu-scale recipe's batch of (image, caption) pairs
    caption_len: int = 12
    caption_vocab: int = 60  # about fashion-mnist-scenes' words
    repeats: int = 8
    warmup: int = 2


QUICK = Sizes(image_depth=8, image_batch=4, image_hw=8, mt_overrides=(("d_model", 32), ("ffn_dim", 64), ("heads", 2),
              ("encoder_layers", 1), ("decoder_layers", 1)), mt_rows=4, mt_len=6, vocab=64, beam_sentences=2,
              beam_len=4, lm_overrides=(("d_model", 32), ("ffn_dim", 64), ("heads", 2), ("layers", 2), ("context", 16)),
              lm_rows=2, lm_new_tokens=8, compile_depth=8, compile_backend="aot_eager", compile_dynamic=False, matmul_n=128, add_elements=1 << 16, norm_rows=64, norm_dim=32,
              process_steps=2, hyper_widths=(16, 32), hyper_layers=1, hyper_rows=2, repeats=2, warmup=1,
              caption_overrides=(("d_model", 32), ("ffn_dim", 64), ("heads", 2), ("encoder_layers", 1),
                                 ("decoder_layers", 1), ("trunk_width", 4)), caption_rows=4, caption_len=4)


def image_model(depth: int, connection: str) -> nn.Module:
    return build("preact-resnet20", depth=depth, connection=connection)


def image_batch(sz: Sizes) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(sz.image_batch, 3, sz.image_hw, sz.image_hw, generator=g), torch.randint(0, 10, (sz.image_batch,), generator=g)


def mt_model(sz: Sizes, spec: str) -> nn.Module:
    return build(spec, vocab_size=sz.vocab, pad_id=0, **dict(sz.mt_overrides))


def mt_batch(sz: Sizes) -> MTBatch:
    return MTBatch.random(sz.mt_rows, sz.mt_len, sz.mt_len, sz.vocab)
