"""What decides a language-model run: :class:`LMTrainConfig` (saved as config.json beside its results), the training
fields a design prescribes (:func:`design_recipe`) and the learning-rate schedule (:func:`learning_rate`).

The training loop that reads them: :mod:`skiplab.train.lm`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from ..config import check_bounds
from ..connections import REGISTRY, parse_spec
from ..connections.across import not_recomputable
from ..corpora.windows import BIN_DTYPES
from ..interop.loggers import parse_loggers
from ..models import GPTConfig, PRESETS, family_of, model_config
from ..models.linear_ce import IMPLS as HEAD_LOSSES
from ..tokenization.lm import check_lm_tokenizer
from . import parametrization
from .parametrization import PARAMETRIZATIONS

SCHEDULES = ("cosine", "constant", "wsd")
DECAY_SHAPES = ("linear", "sqrt")


@dataclass(frozen=True)
class LMTrainConfig:
    """Everything that decides a language-model run; saved as config.json beside its results."""

    model: str = field(default="gpt-small", metadata={
        "help": "model spec: a preset, optionally with options, e.g. gpt-small(connection=2rSkip+LN); the model "
                "options below add to it"})
    corpus: str = field(default="pydocs", metadata={
        "help": "pydocs, enwik8, text8, wikitext-103-raw, tinystories, c4-en or debdocs; "
                "'' = the --train-file etc. given"})
    data_dir: str = field(default="", metadata={
        "help": "where the corpus is ('' = its default place), or a folder of skiplab prepare lm"})
    train_file: str = field(default="", metadata={
        "help": "with --corpus '': a .jsonl[.gz], .txt[.gz], folder, .bin or glob of .bin shards"})
    valid_file: str = field(default="", metadata={"help": "with --corpus '': the validation split, likewise"})
    test_file: str = field(default="", metadata={"help": "with --corpus '': the test split, likewise"})
    bin_dtype: str = field(default="uint16", metadata={"help": "token type of .bin files: uint16 or uint32"})
    tokenizer: str = field(default="bytes", metadata={
        "help": "bytes (UTF-8 bytes, 257 ids with end of text), bpe or unigram (sentencepiece, trained on train), "
                "or a pretrained one from its file: sentencepiece:FILE.model, hf:FILE (a tokenizer.json), "
                "tiktoken:NAME:FILE (NAME gpt2, cl100k_base, ...; FILE its .tiktoken ranks); "
                "KIND(eot=TOKEN):... names the end-of-text token"})
    vocab_size: int = field(default=4096, metadata={
        "min": 2, "help": "subword vocabulary (bpe, unigram); of .bin files, the ids they use"})
    batch_size: int = field(default=32, metadata={"min": 1, "help": "windows per micro-batch"})
    grad_accum: int = field(default=1, metadata={"min": 1, "help": "micro-batches per update"})
    max_steps: int = field(default=2000, metadata={"min": 1, "help": "updates"})
    lr: float = field(default=1e-3, metadata={"help": "peak learning rate"})
    min_lr: float = field(default=1e-4, metadata={"help": "learning rate at the end of the cosine decay"})
    warmup: int = field(default=100, metadata={"min": 0, "help": "linear warm-up steps"})
    schedule: str = field(default="cosine", metadata={
        "help": "cosine (to --min-lr at --max-steps), constant, or wsd (warm-up, stable at --lr, decay to --min-lr "
                "over the last --decay of the updates)"})
    # older_runs: the value every run had before the field existed; a run's key leaves the field out at it
    decay: float = field(default=0.2, metadata={"help": "wsd: the fraction of --max-steps that decays",
                                                "older_runs": 0.2})
    decay_shape: str = field(default="linear", metadata={
        "help": "wsd: linear, or sqrt (lr falls as 1 - sqrt of the decay's progress)", "older_runs": "linear"})
    adam_betas: tuple[float, float] = field(default=(0.9, 0.95), metadata={"help": "AdamW betas"})
    adam_eps: float = field(default=1e-8, metadata={"help": "AdamW epsilon"})
    weight_decay: float = field(default=0.1, metadata={"min": 0.0, "help": "AdamW weight decay, on matrices only"})
    clip_norm: float = field(default=1.0, metadata={"min": 0.0, "help": "clip the gradient's global norm (0 = off)"})
    eval_every: int = field(default=200, metadata={"min": 1, "help": "validate and save every N updates"})
    log_every: int = field(default=1, metadata={
        "min": 0, "help": "a line of steps.jsonl every N updates: loss, lr, gradient norm, clipped, spike, tokens/s, "
                          "FLOP rate (0 = none; spikes and the largest gradient norm still go to the summary)"})
    log_layers: int = field(default=0, metadata={
        "min": 0, "older_runs": 0,
        "help": "a line of layers.jsonl every N updates: per sub-layer the stream's and the branch's RMS, their "
                "ratio, the largest activation over the median, the gradient norm and the update/weight ratio, "
                "and the final norm's input RMS (0 = off)"})
    logger: str = field(default="", metadata={
        "help": "also send the lines to tensorboard, wandb or trackio (comma-separated; each its own package)"})
    valid_tokens: int = field(default=0, metadata={
        "min": 0, "help": "validate on the first documents holding this many tokens (0 = the whole split)"})
    keep_checkpoints: int = field(default=5, metadata={"min": 1, "help": "step checkpoints kept (for averaging)"})
    seed: int = field(default=1, metadata={"help": "seed for initialisation, windows and dropout"})
    device: str = field(default="auto", metadata={"help": "cpu, cuda, cuda:1, or auto"})
    amp: bool = field(default=True, metadata={"help": "bf16 autocast on CUDA (ignored on CPU)"})
    compile: bool = field(default=False, metadata={"help": "run the model through torch.compile"})
    activation_checkpointing: bool = field(default=False, metadata={
        "help": "recompute each layer's activations in the backward pass (less memory, about a third more "
                "compute; the same numbers)"})
    fsdp: bool = field(default=False, metadata={
        "help": "shard parameters, gradients and optimizer state over the processes with FSDP2 (under torchrun)",
        "older_runs": False})
    parametrization: str = field(default="standard", metadata={
        "help": "standard, mup (width muP: hidden matrices' lr / m_d, logits / m_d, attention 1/d_head) or completep "
                "(mup and depth: pre-norm branches x m_L^-alpha, hidden lr x m_L^(alpha-1), AdamW eps / (m_d m_L^alpha))",
        "older_runs": "standard"})
    depth_base: int = field(default=0, metadata={
        "min": 0, "help": "completep: base depth L_base, m_L = L/L_base (0: the model's own L)", "older_runs": 0})
    head_loss: str = field(default="eager", metadata={
        "help": "the output layer's cross-entropy: eager (the logits kept for the backward), chunked (rows in "
                "chunks, their gradient taken in the forward: no batch x context x vocabulary logits; any device) "
                "or liger (liger-kernel's, CUDA)", "older_runs": "eager"})
    out: str = field(default="runs/lm", metadata={"help": "run directory"})

    def __post_init__(self):
        if family_of(self.model) is GPTConfig:  # another family is refused below
            for key, value in design_recipe(self.model).items():  # fields at their defaults take the design's
                if getattr(self, key) == DEFAULTS[key]:
                    object.__setattr__(self, key, value)
        check_bounds(self)
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ValueError(f"need 0 <= --min-lr <= --lr and --lr > 0, got {self.min_lr} and {self.lr}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; known: {', '.join(SCHEDULES)}")
        if self.decay_shape not in DECAY_SHAPES:
            raise ValueError(f"unknown --decay-shape {self.decay_shape!r}; known: {', '.join(DECAY_SHAPES)}")
        if not 0 < self.decay <= 1:
            raise ValueError(f"--decay must be in (0, 1], got {self.decay:g}")
        if self.schedule == "wsd" and stable_end(self) == self.max_steps:
            raise ValueError(f"--decay {self.decay:g} of --max-steps {self.max_steps} is {self.decay * self.max_steps:g} "
                             "updates, which round to none: the run would never decay (give a larger --decay)")
        if self.schedule == "wsd" and self.warmup > stable_end(self):
            raise ValueError(f"--warmup {self.warmup} runs into the decay, which starts after update "
                             f"{stable_end(self)} (--max-steps {self.max_steps}, --decay {self.decay:g})")
        check_lm_tokenizer(self.tokenizer)
        if self.head_loss not in HEAD_LOSSES:
            raise ValueError(f"unknown --head-loss {self.head_loss!r}; known: {', '.join(HEAD_LOSSES)}")
        if self.head_loss == "liger" and self.device == "cpu":
            raise ValueError("--head-loss liger runs on CUDA only; chunked is the same computation on any device")
        parse_loggers(self.logger)
        if self.bin_dtype not in BIN_DTYPES:
            raise ValueError(f"unknown --bin-dtype {self.bin_dtype!r}; known: {', '.join(BIN_DTYPES)}")
        if len(self.adam_betas) != 2:
            raise ValueError(f"adam_betas takes two values, got {self.adam_betas}")
        files = [f"--{s}-file" for s in ("train", "valid", "test") if getattr(self, f"{s}_file")]
        if self.corpus and files:  # the named corpus's splits are read: the files would be ignored, silently
            raise ValueError(f"{', '.join(files)} name{'s a file' if len(files) == 1 else ' files'}, which --corpus "
                             f"{self.corpus} does not read: give --corpus '' to read files")
        if not self.corpus and not (self.train_file and self.valid_file) and not self.data_dir:
            raise ValueError("with --corpus '' give --train-file and --valid-file (or --data-dir a prepared folder)")
        if not self.corpus:  # a run reads token ids or text, not both: a text split is read with the tokenizer
            files = {flag: path for flag, path in (("--train-file", self.train_file), ("--valid-file", self.valid_file),
                                                   ("--test-file", self.test_file)) if path}
            ids = [flag for flag, path in files.items() if path.endswith(".bin")]
            if ids and len(ids) < len(files):
                raise ValueError(f"{', '.join(ids)} {'is' if len(ids) == 1 else 'are'} token ids (.bin) and "
                                 f"{', '.join(f for f in files if f not in ids)} text: give every split as .bin "
                                 "files or every split as text")
            if ids and self.valid_tokens:
                raise ValueError("--valid-tokens takes the first documents of a text split; a .bin split has no "
                                 "documents and is validated whole (give a shorter --valid-file)")
        if family_of(self.model) is not GPTConfig:
            raise ValueError(f"{self.model} is not a language model; known: "
                             f"{', '.join(n for n, (c, _) in PRESETS.items() if c is GPTConfig)}")
        if self.parametrization not in PARAMETRIZATIONS:
            raise ValueError(f"unknown --parametrization {self.parametrization!r}; known: {', '.join(PARAMETRIZATIONS)}")
        connection = self.model_config(256).connection  # a bad spec, option or parametrisation fails here, first
        if self.log_layers and self.compile:  # the hooks would be traced into the compiled graph, and change it
            raise ValueError("--log-layers watches the sub-layers with hooks, which --compile does not allow; "
                             "give one")
        if self.activation_checkpointing and (names := not_recomputable(connection)):
            raise ValueError(f"--activation-checkpointing runs a layer twice, which {names[0]} cannot")

    def model_config(self, vocab_size: int) -> GPTConfig:
        """The model's config, resolved from the spec, for the tokenizer's ``vocab_size``, as the parametrisation
        shapes it (:func:`.parametrization.apply`)."""
        return parametrization.apply(model_config(self.model, vocab_size=vocab_size), self.parametrization,
                                     self.depth_base)

    @property
    def binary(self) -> bool:
        """Pre-tokenised .bin files rather than text."""
        return not self.corpus and self.train_file.endswith(".bin")


DEFAULTS = {f.name: f.default for f in dataclasses.fields(LMTrainConfig)}


def design_recipe(model: str) -> dict[str, Any]:
    """The training fields the model's connection prescribes (``Connection.recipe``; nGPT: weight decay 0, warm-up
    0, as NVIDIA/ngpt's train.py with use_nGPT = 1), empty for most designs. :class:`LMTrainConfig` gives them to
    the fields left at their defaults, so that ``train lm --connection nGPT`` trains as the paper does; a value
    given otherwise is kept (an ablation), and config.json records what the run used."""
    recipe = REGISTRY[parse_spec(model_config(model).connection).name].recipe
    return {k: v for k, v in recipe.items() if k in DEFAULTS}


# Nothing in the recipe depends on these but the cosine schedule's end, which max_steps is: a constant
# schedule may be given more steps on resume.
BUDGET = ("keep_checkpoints",)


def stable_end(cfg: LMTrainConfig) -> int:
    """wsd: the last update at the stable lr, S = max_steps − round(decay · max_steps)."""
    return cfg.max_steps - round(cfg.decay * cfg.max_steps)


def learning_rate(cfg: LMTrainConfig, step: int) -> float:
    """lr of update ``step`` (from 1): warm-up, then cosine decay to min_lr, constant, or wsd:

        lr(s) = lr                                   warmup < s <= S  (S = :func:`stable_end`)
        lr(s) = min_lr + (lr − min_lr) · (1 − f(p)),  p = (s − S) / (max_steps − S),  f(p) = p (linear) or √p (sqrt)

    (warm-up–stable–decay: Hu et al. 2024, MiniCPM, Section 4; the 1 − √ shape: Hägele et al. 2024, "Scaling
    Laws and Compute-Optimal Training Beyond Fixed Training Durations", Section 3). Every update up to S has the
    lr of any longer run's, so a checkpoint of the stable phase can be decayed to several budgets
    (``train lm --branch``)."""
    if step <= cfg.warmup:
        return cfg.lr * step / cfg.warmup
    if cfg.schedule == "constant":
        return cfg.lr
    if cfg.schedule == "wsd":
        end = stable_end(cfg)
        if step <= end:
            return cfg.lr
        p = (step - end) / (cfg.max_steps - end)
        f = p if cfg.decay_shape == "linear" else math.sqrt(p)
        return cfg.min_lr + (cfg.lr - cfg.min_lr) * (1 - f)
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.max_steps - cfg.warmup))
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))
