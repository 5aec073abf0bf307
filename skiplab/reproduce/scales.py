"""The three scales a table runs at: what each of the papers' settings becomes at ``smoke``, ``cpu`` and ``paper``.

A *setting* is one dataset x model x recipe of the papers (``c10-r110``: CIFAR-10 with PreAct-ResNet-110 and
the 164-epoch recipe; ``wmt-base-003``: WMT14 En-De with Transformer Base as the depth-wise LSTM paper trains
it; ``c4-llama130m``: C4 with LLaMA-130M as the Mix-LN and curse-of-depth papers train it). A scale maps each
setting to the run config it starts from, or to the reason it has none there:

- ``paper``: the published setting (He et al. 2016b's CIFAR recipe with the papers' weight decay 2e-4;
  Vaswani et al. 2017's Transformer recipe with each paper's batch, steps, warm-up and validation set; the
  Mix-LN and curse-of-depth LLaMA recipes on C4 in T5 tokens, and OLMo-1B's on the dolma v1.5 sample in OLMo's
  tokens, each read from a folder of ``skiplab prepare lm`` under ``--data-root``, ``c4-t5/`` and
  ``dolma-olmo/`` (:class:`PreparedData`: where it is absent, or holds other tokens, a cell says what it must
  hold and the command that makes it));
- ``cpu``: a faithful miniature that runs in about an hour per table on a 2-core CPU: Fashion-MNIST with
  PreAct-ResNet-20/32 (4,000 training and 4,000 test images, 8 epochs, the lr milestones scaled),
  Multi30k en-de with the ``small`` presets (1,000 updates of 4,096 tokens, warm-up 800), and pydocs with a
  LLaMA-shaped byte-level model of the papers' depth (12 or 24 layers, d 128, 600 updates of 16 x 256 bytes);
- ``smoke``: seconds per run on tiny subsets of the paper's own datasets, to keep every table's plumbing
  alive (the tests write such datasets in the official formats).

Two settings that resolve to the same run config share their runs (the cpu miniature of CIFAR-10 and of
CIFAR-100 is the same Fashion-MNIST run), so a run is trained once for every table that needs it.

A setting whose number is not in the paper's unit says so in ``metric`` (the language-model miniatures report
bits per byte where the papers report perplexity per T5 token); the report names both.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..models import model_config, with_options
from ..train.caption import CaptionTrainConfig
from ..train.image import ImageTrainConfig
from ..train.lm import LMTrainConfig
from ..train.mt import MTTrainConfig
from .prepared import DATA_ROOT, PreparedData

SCALES = ("smoke", "cpu", "paper")


@dataclass(frozen=True)
class Setting:
    """What a setting is at one scale: the task, the config its runs start from, the model size, and scoring."""

    task: str  # "image", "mt", "lm" or "caption"
    config: ImageTrainConfig | MTTrainConfig | LMTrainConfig | CaptionTrainConfig
    about: str  # one line for the table's header
    size: str = ""  # MT: the preset size the families are built at (base, big, small)
    layers: dict[int, int] = dataclasses.field(default_factory=dict)  # MT: paper's layer count -> this scale's
    seconds_per_run: float = 0.0  # estimated wall time of one run here (two runs side by side), for --list
    gpu_hours: float = 0.0  # paper scale: estimated GPU-hours of one run (basis: GPU_BASIS)
    metric: str = ""  # what our number is where it is not the table's metric (LM: "bits per byte")
    prepared: PreparedData | None = None  # paper-scale LM: the prepared folder under --data-root its runs read


@dataclass(frozen=True)
class Scale:
    name: str
    settings: dict[str, Setting | str]  # setting -> its config here, or why it has none at this scale
    seeds: int  # seeds per row that --list estimates for (the papers' 5 at paper scale; --seeds sets a run's)
    about: str


def _image(**kw: Any) -> ImageTrainConfig:
    return ImageTrainConfig(device="auto", **kw)


def _mt(**kw: Any) -> MTTrainConfig:
    return MTTrainConfig(device="auto", **kw)


def _lm(**kw: Any) -> LMTrainConfig:
    return LMTrainConfig(device="auto", **kw)


# ---- paper ------------------------------------------------------------------------------------------------
GPU_BASIS = (
    "Estimates, not measurements. Transformer: Vaswani et al. 2017 (Section 5.2) train Base for 100k updates of "
    "~25k tokens in 12 h and Big for 300k in 3.5 days on 8 P100 GPUs, i.e. 96 and 672 P100-hours; a setting's "
    "hours scale those by its updates and tokens per update. PreAct-ResNet: forward + backward FLOPs of one "
    "32x32 image (torch.utils.flop_counter: 1.52 GFLOP for ResNet-110, 0.24 for ResNet-20) x 50,000 images x "
    "164 epochs, at an assumed sustained 10 TFLOP/s. LLaMA and OLMo: 6 FLOPs per token for each weight of the "
    "layers' matrices and the output layer (forward and backward) x the updates' tokens, at an assumed sustained "
    "100 TFLOP/s (bf16). Captioner: 6 FLOPs per weight per position (the encoder's over an assumed 50 regions, "
    "the decoder's and the output's over 13 words) x 5 captions x 113,287 images x the epochs, at an assumed "
    "sustained 10 TFLOP/s.")


def _resnet_hours(depth: int) -> float:
    gflop = {20: 0.244, 32: 0.414, 44: 0.584, 56: 0.754, 110: 1.518}[depth]
    return gflop * 1e9 * 50_000 * 164 / 10e12 / 3600


def _transformer_hours(size: str, steps: int, tokens: int) -> float:
    per_100k = {"base": 96.0, "big": 672.0 / 3}[size]
    return per_100k * steps / 100_000 * tokens / 25_000


_DEPTHS = (20, 32, 44, 56, 110)
_PAPER_IMAGE = {
    "c10-r110": Setting("image", _image(model="preact-resnet110", dataset="cifar10"),
                        "CIFAR-10, PreAct-ResNet-110, 164 epochs (He et al. 2016b; weight decay 2e-4)",
                        gpu_hours=_resnet_hours(110)),
    **{f"c100-r{d}": Setting("image", _image(model=f"preact-resnet{d}", dataset="cifar100"),
                             f"CIFAR-100, PreAct-ResNet-{d}, 164 epochs (He et al. 2016b; weight decay 2e-4)",
                             gpu_hours=_resnet_hours(d))
       for d in _DEPTHS},
}

# Vaswani et al. 2017: base 100k updates (dropout 0.1), big 300k (dropout 0.3 for En-De); warm-up 4000;
# the schedule of their Eq. 3. The rSkip+LN paper trains IWSLT with 4,096-token batches on one GPU and
# WMT14 with 16,384 tokens for 550k updates (Section 4.1.2); the SAS paper follows Vaswani et al. on WMT
# (25k tokens a batch, here 4 x 6,250) and uses 4,096 tokens on IWSLT; the depth-wise LSTM paper uses
# 25k target tokens, warm-up 8,000, newstest2012+2013 for validation, a checkpoint every 1,500 updates (its
# Section 5.1). Vaswani et al. save every 10 minutes; here every 1,000 updates. 32k joint subwords
# (tensor2tensor's default; the depth-wise LSTM paper's 32k BPE merges).
_MT_PAPER = dict(schedule="vaswani", keep_checkpoints=20, max_len=256, vocab_size=32000)


def _paper_mt(corpus: str, size: str, steps: int, tokens: int, freq: int, warmup: int = 4000,
              save_every: int = 1000) -> dict[str, Any]:
    return dict(task="mt", config=_mt(model=f"transformer-{size}", corpus=corpus, src="en",
                                      tgt="vi" if corpus.startswith("iwslt") else "de", max_steps=steps,
                                      max_tokens=tokens, update_freq=freq, warmup=warmup, save_every=save_every,
                                      **_MT_PAPER), size=size,
                gpu_hours=_transformer_hours(size, steps, tokens * freq))


_PAPER_MT = {
    "iwslt-base": Setting(**_paper_mt("iwslt15-en-vi", "base", 100_000, 4096, 1),
                          about="IWSLT15 En-Vi (tst2012 valid, tst2013 test), Transformer Base, 4,096 tokens, 100k updates"),
    "iwslt-big": Setting(**_paper_mt("iwslt15-en-vi", "big", 300_000, 4096, 1),
                         about="IWSLT15 En-Vi, Transformer Big, 4,096 tokens, 300k updates"),
    "wmt-base-000": Setting(**_paper_mt("wmt14-en-de", "base", 550_000, 4096, 4),
                            about="WMT14 En-De (newstest2013 valid, newstest2014 test), Base, 16,384 tokens, 550k updates"),
    "wmt-big-000": Setting(**_paper_mt("wmt14-en-de", "big", 550_000, 4096, 4),
                           about="WMT14 En-De, Transformer Big, 16,384 tokens, 550k updates"),
    "wmt-base-001": Setting(**_paper_mt("wmt14-en-de", "base", 100_000, 6250, 4),
                            about="WMT14 En-De (newstest2013 valid), Base, 25k tokens, 100k updates (Vaswani et al.)"),
    "wmt-big-001": Setting(**_paper_mt("wmt14-en-de", "big", 300_000, 6250, 4),
                           about="WMT14 En-De, Transformer Big, 25k tokens, 300k updates (Vaswani et al.)"),
    "wmt-base-003": Setting(**_paper_mt("wmt14-en-de(valid=newstest2012+newstest2013)", "base", 100_000, 6250, 4,
                                        warmup=8000, save_every=1500),
                            about="WMT14 En-De (newstest2012+2013 valid), Base, 25k target tokens, 100k updates, "
                                  "warm-up 8k"),
    "wmt-big-003": Setting(**_paper_mt("wmt14-en-de(valid=newstest2012+newstest2013)", "big", 300_000, 6250, 4,
                                       warmup=8000, save_every=1500),
                           about="WMT14 En-De (newstest2012+2013 valid), Big, 25k target tokens, 300k updates, warm-up 8k"),
}
# The Mix-LN paper's LLaMA models (its Table 7 and Appendix A.1: sequences of 256 T5 tokens, 512 a batch,
# Adam, lr 1e-3 up to 250M and 5e-4 for 1B, warm-up 10% of the updates, cosine to 10%; the authors' scripts:
# weight decay 0, no gradient clipping), and LLaMA-350M as the curse-of-depth authors' run_350m.sh trains it.
# Per setting: the preset, updates, peak lr, the paper's layer count.
LM_PAPER = {
    "c4-llama71m": ("llama-71m", 10_000, 1e-3, 12),
    "c4-llama130m": ("llama-130m", 20_000, 1e-3, 12),
    "c4-llama250m": ("llama-250m", 40_000, 1e-3, 24),
    "c4-llama350m": ("llama-350m", 60_000, 5e-4, 24),
    "c4-llama1b": ("llama-1b", 100_000, 5e-4, 24),
}
# Their tokenizer: the authors' code (GaLore's torchrun_main.py) loads AutoTokenizer "t5-base" and builds LLaMA
# configs of vocab_size 32,000: T5's spiece.model, whose 32,000 pieces are those ids (the Hugging Face tokenizer's
# 100 extra ids, 32,000-32,099, never occur in text). Its end of text is T5's EOS, 1, which the authors' tokenizer
# appends to each document. The papers' data are C4 en's training shards, and their perplexity is on its
# validation set: a folder prepared from ``--corpus c4-en`` holds both (its test split is C4's validation).
C4_T5 = PreparedData(
    folder="c4-t5", corpus="c4-en", tokenizer="sentencepiece:spiece.model", vocab_size=32_000, eot=1,
    data=f"C4 en (the allenai/c4 en shards c4-train.NNNNN-of-01024.json.gz and c4-validation.NNNNN-of-00008.json.gz, "
         f"in {DATA_ROOT}/c4-en)",
    tokenizer_about="T5's tokenizer (spiece.model of google-t5/t5-base, in t5-base/: SentencePiece, 32,000 ids)",
    prepare=f"--corpus c4-en --data-dir {DATA_ROOT}/c4-en --tokenizer sentencepiece:t5-base/spiece.model")


def _lm_paper_hours(preset: str, steps: int, tokens: int) -> float:
    """GPU-hours of ``steps`` updates of ``tokens`` tokens (GPU_BASIS): 6 FLOPs a weight of the matrices a token
    meets (attention's four, the MLP's, the output layer), at 100 TFLOP/s."""
    m = model_config(preset)
    mlp = (3 if m.mlp == "swiglu" else 2) * m.d_model * m.ffn_dim
    weights = m.layers * (4 * m.d_model**2 + mlp) + m.vocab_size * m.d_model
    return 6 * weights * steps * tokens / 100e12 / 3600


def _e(v: float) -> str:
    return f"{v:.0e}".replace("e-0", "e-")  # 1e-3, 5e-4


def _paper_lm(preset: str, steps: int, lr: float) -> Setting:
    """A C4 LLaMA setting as the papers train it, from the prepared folder C4_T5: micro-batches of 64 sequences
    (32 for 1B) accumulated to 512, validation on the first 10M tokens every 1,000 updates (the authors'
    evaluate_model: target_eval_tokens 10M, --eval_every 1000), the final model scored on the whole split."""
    micro = 32 if preset == "llama-1b" else 64
    cfg = _lm(model=preset, corpus=C4_T5.corpus, tokenizer=C4_T5.tokenizer, batch_size=micro, grad_accum=512 // micro,
              max_steps=steps, warmup=steps // 10, lr=lr, min_lr=lr / 10, adam_betas=(0.9, 0.999), weight_decay=0.0,
              clip_norm=0.0, eval_every=1000, valid_tokens=10_000_000, keep_checkpoints=1)
    about = (f"C4 en in T5 tokens ({DATA_ROOT}/{C4_T5.folder}), {preset}, {steps // 1000}K updates of 512 x 256 "
             f"tokens, Adam (no weight decay, β 0.9 / 0.999), lr {_e(lr)}, warm-up {steps // 10_000}K, cosine to "
             f"{_e(lr / 10)}, no clipping; validation on the first 10M tokens every 1,000 updates; ours: perplexity "
             "per T5 token of the final model on C4 validation (every shard prepared)")
    return Setting("lm", cfg, about, gpu_hours=_lm_paper_hours(preset, steps, 512 * 256), prepared=C4_T5)


# The hyper-connections paper's dense models (Zhu et al., ICLR 2025, Section 4, "Experiment Settings"): OLMo-1B
# trained as Groeneveld et al. 2024 train it, on the dolma v1.5 sample, 500B tokens; the loss is OLMo's, averaged
# over its V2 and V3 validation sets. Per setting: the preset, the paper's layer count.
OLMO_PAPER = {"dolma-olmo1b": ("olmo-1b", 16)}
# OLMo-1B's recipe (OLMo's configs/official/OLMo-1B.yaml): AdamW lr 4e-4, betas 0.9 / 0.95, weight decay 0.1,
# cosine_with_warmup (t_warmup 2000, alpha_f 0.1: to 10%), max_grad_norm 1.0, 2,048 sequences of 2,048 tokens a
# batch (micro-batches of 8), bf16; the tokenizer its config names, allenai_eleuther-ai-gpt-neox-20b-pii-special
# (GPT-NeoX-20B's BPE with OLMo's PII tokens: vocab_size 50,280, eos_token_id 50,279, <|endoftext|>). 500B tokens
# are 119,209 such updates. OLMo evaluates every 1,000 updates. Differences kept: OLMo decays no embedding
# (decay_embeddings false), skiplab's recipe decays every matrix; the V2 and V3 validation sets (OLMo's
# eval-data/perplexity/v2_small_gptneox20b and v3_small_gptneox20b, pre-tokenised, one set per source) have no
# loader in skiplab, so ours is the folder's own test split; and LMTask.measure scores perplexity, not loss, so
# ours is exp of the loss per token, in the paper's tokens.
OLMO_STEPS = round(500e9 / (2048 * 2048))
NO_OLMO_EVAL = ("skiplab has no loader for OLMo's V2 and V3 validation sets, so ours is perplexity per OLMo token "
                "(exp of the loss) on the folder's test split of held-out Dolma documents, not the paper's loss "
                "averaged over those sets")
DOLMA_OLMO = PreparedData(
    folder="dolma-olmo", corpus="", tokenizer="hf:tokenizer.json", vocab_size=50_280, eot=50_279,
    data=(f"the dolma v1.5 sample's documents (allenai/dolma, JSON lines with \"text\"), split into folders of "
          f".jsonl.gz files {DATA_ROOT}/dolma/train, valid and test (held-out documents)"),
    tokenizer_about=("OLMo's tokenizer (the file OLMo-1B's config names, the OLMo repository's "
                     "tokenizers/allenai_eleuther-ai-gpt-neox-20b-pii-special.json, as olmo/tokenizer.json: "
                     "GPT-NeoX's BPE, 50,280 ids, end of text <|endoftext|> 50279)"),
    prepare=(f"--corpus '' --train-file {DATA_ROOT}/dolma/train --valid-file {DATA_ROOT}/dolma/valid --test-file "
             f"{DATA_ROOT}/dolma/test --tokenizer hf:olmo/tokenizer.json"),
    caveat=NO_OLMO_EVAL)


def _paper_olmo(preset: str) -> Setting:
    cfg = _lm(model=preset, corpus=DOLMA_OLMO.corpus, data_dir=DOLMA_OLMO.folder, tokenizer=DOLMA_OLMO.tokenizer,
              batch_size=8, grad_accum=256, max_steps=OLMO_STEPS, warmup=2000, lr=4e-4, min_lr=4e-5,
              adam_betas=(0.9, 0.95), weight_decay=0.1, clip_norm=1.0, eval_every=1000, valid_tokens=10_000_000,
              keep_checkpoints=1)
    about = (f"the dolma v1.5 sample in OLMo's tokens ({DATA_ROOT}/{DOLMA_OLMO.folder}), {preset}, {OLMO_STEPS:,} "
             "updates of 2,048 x 2,048 tokens (500B), OLMo-1B's recipe: AdamW (0.9, 0.95), weight decay 0.1, lr 4e-4, "
             "warm-up 2,000, cosine to 4e-5, clipping at 1.0; validation on the first 10M tokens of the valid split "
             f"every 1,000 updates; ours: {NO_OLMO_EVAL}")
    return Setting("lm", cfg, about, gpu_hours=_lm_paper_hours(preset, OLMO_STEPS, 2048 * 2048), metric="perplexity",
                   prepared=DOLMA_OLMO)


_PAPER_OLMO = {k: _paper_olmo(preset) for k, (preset, _) in OLMO_PAPER.items()}

# DeepNet's base setting (its Table 5), on WMT-14 En-De (skiplab has no WMT-17 loader): 100K updates of 128 x 4,096
# tokens (here 32 x 16,384), inverse square root from a 4,000-update warm-up, lr 1.5e-3, Adam (0.9, 0.98) with
# ε 1e-8, weight decay 1e-4, label smoothing 0.1, no clipping; dropout 0.4 is the cells' model option.
_DEEPNET_LAYERS = {6: 6, 18: 18, 50: 50, 100: 100}
_DEEPNET_PAPER = Setting(
    "mt", _mt(model="transformer-base", corpus="wmt14-en-de", src="en", tgt="de", max_steps=100_000, max_tokens=16_384,
              update_freq=32, warmup=4000, lr=1.5e-3, schedule="inverse_sqrt", adam_betas=(0.9, 0.98), adam_eps=1e-8,
              weight_decay=1e-4, label_smoothing=0.1, clip_norm=0.0, save_every=1000, keep_checkpoints=1,
              max_len=256, vocab_size=32000),
    "WMT-14 En-De standing in for WMT-17 (newstest2014 test), Transformer base (512 / 2,048 / 8 heads) of 6-6 to "
    "100-100 layers, DeepNet's base recipe: 100K updates of 128 x 4,096 tokens, lr 1.5e-3, inverse sqrt, warm-up "
    "4,000, dropout 0.4, weight decay 1e-4", size="base", layers=_DEEPNET_LAYERS,
    gpu_hours=_transformer_hours("base", 100_000, 128 * 4096) * (6 + 18 + 50 + 100) / 4 / 6)  # x the mean depth / 6
# Peri-LN's paper scale: the shapes and recipe of its 400M, 1.5B and 3.2B models were not read here.
PERI_SETTINGS = ("dclm-peri400m", "dclm-peri1.5b", "dclm-peri3.2b")
_NO_PERI = ("no paper-scale setting: the Peri-LN paper's model shapes and recipe per size were not read here "
            "(its data: 30B tokens of DCLM-baseline in tiktoken's cl100k_base)")

# The SAS paper's MSCOCO captioner (Section 4.3, Table 5): its configuration and recipe are not given. skiplab's is
# the usual COCO captioner's cross-entropy stage: Karpathy's splits (113,287 training images with restval), words
# seen fewer than 5 times -> <unk>, bottom-up region features, Base width with 3 layers a side (captioner-base),
# 20 epochs of 50 (image, caption) pairs, Vaswani's schedule with 10,000 warm-up updates (the M² Transformer's),
# label smoothing 0.1, the average of the last 5 epochs' checkpoints, beam 3. No self-critical stage.
_COCO_EPOCH = 113_287 * 5 // 50


def _caption_hours(epochs: int) -> float:
    m = model_config("captioner-base", vocab_size=10_000)
    enc = m.encoder_layers * (4 * m.d_model**2 + 2 * m.d_model * m.ffn_dim) + m.feature_dim * m.d_model
    dec = m.decoder_layers * (8 * m.d_model**2 + 2 * m.d_model * m.ffn_dim) + m.vocab_size * m.d_model
    return 6 * (enc * 50 + dec * 13) * 113_287 * 5 * epochs / 10e12 / 3600


_PAPER_CAPTION = Setting(
    "caption", CaptionTrainConfig(model="captioner-base", dataset="", captions="dataset_coco.json",
                                  feature_dir="cocobu_att", epochs=20, batch_size=50, schedule="vaswani",
                                  warmup=10_000, save_every=_COCO_EPOCH, keep_checkpoints=5, device="auto",
                                  out="runs/caption"),
    "MSCOCO, Karpathy's splits, bottom-up region features, captioner-base (d 512, 3 + 3 layers), 20 epochs of 50 "
    "pairs, Vaswani's schedule (warm-up 10,000), the last 5 epochs averaged, beam 3", gpu_hours=_caption_hours(20))

_PAPER_LAYERS = {n: n for n in (2, 6, 12, 18, 24)}
PAPER = Scale("paper", {**_PAPER_IMAGE, **{k: dataclasses.replace(v, layers=_PAPER_LAYERS)
                                          for k, v in _PAPER_MT.items()},
                        **{k: _paper_lm(preset, steps, lr) for k, (preset, steps, lr, _) in LM_PAPER.items()},
                        **_PAPER_OLMO, "wmt17-deepnet": _DEEPNET_PAPER, **{k: _NO_PERI for k in PERI_SETTINGS},
                        "coco-caption": _PAPER_CAPTION},
              seeds=5,
              about="the published settings (a GPU per run; the papers average 5 runs for the image tables)")

# ---- cpu --------------------------------------------------------------------------------------------------
_CPU_IMAGE_RUN = dict(dataset="fashion-mnist", epochs=8, train_subset=4000, test_subset=4000)
_FMNIST = "Fashion-MNIST (4,000 train / 4,000 test images), PreAct-ResNet-{d}, 8 epochs (lr / 10 at 4 and 6)"
_CPU_MT = _mt(model="transformer-small", corpus="multi30k", src="en", tgt="de", max_steps=1000, warmup=800,
              save_every=100, keep_checkpoints=10)
_CPU_MT_ABOUT = ("Multi30k en-de (test2016), {size} preset, 1,000 updates of 4,096 tokens, warm-up 800 "
                 "(one miniature for every MT setting)")
_NO_BIG = "no Big model at cpu scale (the small preset stands in for Base only)"
# LM: the papers' LLaMA at their depth (12 layers for 71M and 130M, 24 beyond), a quarter of LLaMA-71M's width
# (d 128, 4 heads, SwiGLU 344 = 1368 / 4, rounded to 8), on pydocs in UTF-8 bytes; the papers' recipe otherwise
# (Adam: AdamW with no weight decay, betas 0.9 / 0.999; lr 1e-3, warm-up 10%, cosine to 10%, no clipping).
# seconds_per_run: one update of 16 x 256 bytes timed with one thread beside two other one-thread training
# runs (median of 3 after a warm-up): the 12-layer model 0.76x and the 24-layer one 1.71x a gpt-small update,
# scaled by gpt-small's recorded 1.37 s per update two side by side (docs/language-models.md); 600 updates plus
# six validations on 100k bytes and the test split: ~690 x 1.04 s and ~690 x 2.35 s.
# Its norm is llama-71m's, RMS: the Mix-LN and curse-of-depth rows build RMSNorm, as the papers' LLaMA models do,
# whether they name it (MixLN+RMS, PreRMS(scale=depth): papers_lm) or not (MixLN, LNS take the model's norm).
# The preset's norm enters the run key, so its runs are keyed anew: runs of this miniature recorded before the
# LLaMA presets had a norm are not found again.
_CPU_LM = _lm(model="llama-71m(d_model=128,heads=4,ffn_dim=344)", corpus="pydocs", tokenizer="bytes",
              batch_size=16, max_steps=600, warmup=60, lr=1e-3, min_lr=1e-4, adam_betas=(0.9, 0.999),
              weight_decay=0.0, clip_norm=0.0, eval_every=100, valid_tokens=100_000, keep_checkpoints=1)
_CPU_LM_ABOUT = ("pydocs (UTF-8 bytes), a LLaMA-shaped model of {n} layers (d 128, 4 heads, SwiGLU 344, RMSNorm, "
                 "rotary), 600 updates of 16 x 256 bytes, lr 1e-3, warm-up 60, cosine to 1e-4, no clipping "
                 "(one miniature for every {n}-layer model size)")
BPB = "bits per byte"
# OLMo-1B's miniature: its 16 layers at the LLaMA miniature's width (d 128, 4 heads; SwiGLU 512, OLMo's 4d),
# LayerNorm, rotary, tied output; skiplab's LM recipe, which is OLMo's optimiser (AdamW 0.9 / 0.95, weight decay
# 0.1 on matrices, clipping at 1.0), over the LLaMA miniature's 600 updates of 16 x 256 bytes at lr 1e-3.
# seconds_per_run: not timed; between the 12- and 24-layer LLaMA miniatures' by layer count.
_CPU_OLMO = _lm(model="olmo-1b(d_model=128,heads=4,ffn_dim=512,context=256)", corpus="pydocs", tokenizer="bytes",
                batch_size=16, max_steps=600, warmup=60, lr=1e-3, min_lr=1e-4, eval_every=100, valid_tokens=100_000,
                keep_checkpoints=1)
_CPU_OLMO_ABOUT = ("pydocs (UTF-8 bytes), an OLMo-1B-shaped model of 16 layers (d 128, 4 heads, SwiGLU 512, "
                   "LayerNorm, rotary, tied output), 600 updates of 16 x 256 bytes, AdamW (0.9, 0.95), weight decay "
                   "0.1, lr 1e-3, warm-up 60, cosine to 1e-4, clipping at 1.0")
CPU = Scale("cpu", {
    "c10-r110": Setting("image", _image(model="preact-resnet20", **_CPU_IMAGE_RUN), _FMNIST.format(d=20),
                        seconds_per_run=300),
    **{f"c100-r{d}": (Setting("image", _image(model=f"preact-resnet{d}", **_CPU_IMAGE_RUN), _FMNIST.format(d=d),
                              seconds_per_run=300 * d / 20)
                      if d in (20, 32) else f"ResNet-{d} does not fit the hour at cpu scale")
       for d in _DEPTHS},
    **{k: (Setting("mt", _CPU_MT, _CPU_MT_ABOUT.format(size="small"), size="small", layers={6: 3, 2: 1},
                   seconds_per_run=3300)  # 000-table2's cpu runs: 2,886-3,320 s two side by side, + scoring
           if "base" in k else _NO_BIG) for k in _PAPER_MT},
    **{k: Setting("lm", dataclasses.replace(_CPU_LM, model=with_options(_CPU_LM.model, layers=n)) if n != 12 else _CPU_LM,
                  _CPU_LM_ABOUT.format(n=n), seconds_per_run=720 if n == 12 else 1620, metric=BPB)
       for k, (_, _, _, n) in LM_PAPER.items()},
    **{k: Setting("lm", _CPU_OLMO, _CPU_OLMO_ABOUT, seconds_per_run=1000, metric=BPB) for k in OLMO_PAPER},
    # DeepNet: the MT miniature at a sixth of the paper's depth (1-1, 3-3, 8-8, 16-16 layers), dropout 0.4 (the cells'),
    # DeepNet's lr 1.5e-3 over the miniature's warm-up; seconds_per_run: the 3-layer MT run's 3,300 s scaled by depth
    "wmt17-deepnet": Setting("mt", dataclasses.replace(_CPU_MT, lr=1.5e-3, weight_decay=1e-4, adam_eps=1e-8),
                             _CPU_MT_ABOUT.format(size="small") + ", a sixth of DeepNet's depth, lr 1.5e-3",
                             size="small", layers={6: 1, 18: 3, 50: 8, 100: 16}, seconds_per_run=3300 * 7 / 3),
    # Peri-LN: the LLaMA miniature (shared runs with the Mix-LN and curse-of-depth tables), 400M at 12 layers and 1.5B
    # at 24; 3.2B has no deeper miniature in the hour
    "dclm-peri400m": Setting("lm", _CPU_LM, _CPU_LM_ABOUT.format(n=12), seconds_per_run=720, metric=BPB),
    "dclm-peri1.5b": Setting("lm", dataclasses.replace(_CPU_LM, model=with_options(_CPU_LM.model, layers=24)),
                             _CPU_LM_ABOUT.format(n=24), seconds_per_run=1620, metric=BPB),
    "dclm-peri3.2b": "no cpu miniature deeper than 24 layers (the 1.5B column's) fits the cpu scale",
    # captioning: fashion-mnist-scenes (12,000 / 1,000 / 1,000 scenes of 1-3 garments, five captions each) with
    # captioner-small (d 128, 2 + 2 layers, a PreAct trunk of width 16 over the 64 x 64 pixels), 3,000 updates of 50
    # pairs (2.5 epochs), lr 1e-3 after 300 warm-up updates, captions whole (the longest has 28 words, where COCO's
    # recipe cuts at 16); seconds_per_run: 0.42 s an update timed with one thread
    # beside two one-thread training runs, x 3,000, + validation and the test's beam search
    "coco-caption": Setting("caption", CaptionTrainConfig(model="captioner-small", max_steps=3000, warmup=300, lr=1e-3,
                                                          save_every=300, keep_checkpoints=10, batch_size=50,
                                                          max_caption_len=30, device="auto"),
                            "fashion-mnist-scenes (12,000 train / 1,000 test scenes), captioner-small (d 128, 2 + 2 "
                            "layers, PreAct trunk over 64 x 64 pixels), 3,000 updates of 50 pairs, lr 1e-3, warm-up "
                            "300, the last 5 checkpoints averaged, beam 3", seconds_per_run=1400),
}, seeds=2, about="miniatures for a 2-core CPU: about an hour per table at the default 2 seeds a row")

# ---- smoke ------------------------------------------------------------------------------------------------
_SMOKE_IMAGE_RUN = dict(epochs=1, train_subset=64, test_subset=32, batch_size=32)
_SMOKE_MODEL = "small(d_model=32,ffn_dim=64,heads=2,encoder_layers=1,decoder_layers=1)"
_SMOKE_MT = dict(max_steps=2, warmup=1, save_every=1, keep_checkpoints=3, max_tokens=512, update_freq=1, vocab_size=120,
                 max_len=64)


def _smoke_lm(layers: int) -> LMTrainConfig:
    return dataclasses.replace(_CPU_LM, model=f"llama-71m(d_model=32,heads=2,ffn_dim=64,layers={layers},context=32)",
                               corpus="c4-en", batch_size=4, max_steps=2, warmup=1, eval_every=1, valid_tokens=2000)


SMOKE = Scale("smoke", {
    **{k: Setting("image", _image(model="preact-resnet20", dataset=v.config.dataset, **_SMOKE_IMAGE_RUN),
                  f"{v.config.dataset} (64 train / 32 test images), PreAct-ResNet-20, 1 epoch", seconds_per_run=2)
       for k, v in _PAPER_IMAGE.items()},
    **{k: Setting("mt", dataclasses.replace(v.config, model="transformer-" + _SMOKE_MODEL, schedule="inverse_sqrt",
                                            **_SMOKE_MT),
                  f"{v.config.corpus} {v.config.src}-{v.config.tgt}, a d=32 model of 1-3 layers, 2 updates",
                  size=_SMOKE_MODEL, layers={2: 1, 6: 1, 12: 2, 18: 2, 24: 3}, seconds_per_run=4)
       for k, v in _PAPER_MT.items()},
    **{k: Setting("lm", _smoke_lm(n // 6),
                  f"c4-en (UTF-8 bytes), a d=32 LLaMA-shaped model of {n // 6} layers, 2 updates", seconds_per_run=2,
                  metric=BPB)
       for k, (_, _, _, n) in LM_PAPER.items()},
    **{k: Setting("lm", dataclasses.replace(_CPU_OLMO, model=f"olmo-1b(d_model=32,heads=2,ffn_dim=64,layers={n // 6},"
                                                           "context=32)", corpus="c4-en", batch_size=4, max_steps=2,
                                            warmup=1, eval_every=1, valid_tokens=2000),
                  f"c4-en (UTF-8 bytes; skiplab has no Dolma loader), a d=32 OLMo-shaped model of {n // 6} layers, "
                  "2 updates", seconds_per_run=2, metric=BPB)
       for k, (_, n) in OLMO_PAPER.items()},
    "wmt17-deepnet": Setting("mt", dataclasses.replace(_DEEPNET_PAPER.config, model="transformer-" + _SMOKE_MODEL,
                                                       **_SMOKE_MT),
                             "wmt14-en-de en-de, a d=32 model of 1-4 layers, 2 updates", size=_SMOKE_MODEL,
                             layers={6: 1, 18: 2, 50: 3, 100: 4}, seconds_per_run=4),
    **{k: Setting("lm", _smoke_lm(n), f"c4-en (UTF-8 bytes), a d=32 LLaMA-shaped model of {n} layers, 2 updates",
                  seconds_per_run=2, metric=BPB) for k, n in zip(PERI_SETTINGS, (2, 3, 4))},
    "coco-caption": Setting("caption", CaptionTrainConfig(
        model="captioner-small(d_model=32,ffn_dim=64,heads=2,encoder_layers=1,decoder_layers=1,trunk_width=4)",
        train_scenes=40, valid_scenes=8, test_scenes=6, min_count=1, max_steps=2, warmup=1, save_every=1,
        batch_size=20, device="auto"),
        "fashion-mnist-scenes (40 train / 6 test scenes), a d=32 captioner, 2 updates", seconds_per_run=4),
}, seeds=2, about="seconds per run on tiny subsets of the paper's datasets: the plumbing of every table")

BY_NAME = {s.name: s for s in (SMOKE, CPU, PAPER)}


def scale(name: str) -> Scale:
    if name not in BY_NAME:
        raise ValueError(f"unknown scale {name!r}; known: {', '.join(SCALES)}")
    return BY_NAME[name]
