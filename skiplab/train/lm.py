"""Language modelling with any connection: a decoder-only model on random windows of a corpus.

AdamW (β 0.9 / 0.95, weight decay on matrices only: biases, norms, gains and the connections' vectors are
not decayed, as nanoGPT's ``configure_optimizers`` does by dimension), a linear warm-up to ``lr`` over
``warmup`` steps, then cosine decay to ``min_lr`` at ``max_steps`` (or constant), gradient clipping, bf16
autocast on CUDA. An update is ``grad_accum`` micro-batches of ``batch_size`` windows of ``context + 1``
tokens (skiplab.corpora.windows), drawn from one generator whose state the checkpoints keep; the loss is the
mean cross-entropy over the update's tokens. After every update the model's ``after_step()`` runs (nGPT renormalises
its matrices; the other designs do nothing); a design's own recipe (nGPT: no weight decay, no warm-up) replaces the
fields left at their defaults (:func:`design_recipe`). Every ``eval_every`` steps the validation split is scored
(loss per token and bits per byte) and the run saved. The loop below is the whole of training.

``parametrization`` chooses the optimizer's groups and what they ask of the model (:mod:`.parametrization`):
``standard`` (the above), ``mup`` (width μP) or ``completep`` (width μP and CompleteP's depth scaling); the base
width is the model's ``mup_base_width`` (``--mup-base-width``), the base depth the run's ``depth_base``; config.json
records the multipliers and every group's lr factor, weight decay and ε.

    lr(s) = lr · s / warmup                                                    s <= warmup
    lr(s) = min_lr + (lr − min_lr) · (1 + cos(π (s − warmup) / (max_steps − warmup))) / 2   after

Under torchrun the update's micro-batches are shared out, micro-batch k to rank k mod N (``grad_accum``
must be a multiple of N), every rank drawing the same windows; each rank's loss is scaled by N so that
DDP's mean over the ranks is the gradient of the update's mean loss. N processes thus compute what one
process with the same ``grad_accum`` computes.
"""

from __future__ import annotations

import dataclasses
import filecmp
import json
import math
import shutil
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .. import distributed, run_dir
from ..config import check_bounds
from ..connections import REGISTRY, parse_spec
from ..connections.across import not_recomputable
from ..device import pick_device
from ..interop.loggers import parse_loggers
from ..models import GPTConfig, PRESETS, build_model, family_of, model_config, model_from_checkpoint
from ..corpora.documents import Documents, load_documents, read_documents
from ..tokenization.lm import (LM_TOKENIZERS, ByteTokenizer, LMTokenizer, SubwordTokenizer, check_lm_tokenizer,
                                  load_lm_tokenizer, train_lm_tokenizer)
from ..tokenization.pretrained import read_pretrained
from ..corpora.shards import Prepared, check_prepared, is_prepared, read_prepared
from ..corpora.windows import (BIN_DTYPES, Stream, bits_per_byte, count_words, eval_windows, perplexity, read_bin,
                            token_stream, unigram_nats, window_starts, windows_at)
from . import layer_telemetry, parametrization, sharded
from .layer_telemetry import LayerWatch
from .parametrization import PARAMETRIZATIONS, parameter_groups, set_lr  # noqa: F401  (parameter_groups: its home)
from .run import Run
from .telemetry import grad_norm

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
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW weight decay, on matrices only"})
    clip_norm: float = field(default=1.0, metadata={"help": "clip the gradient's global norm (0 = off)"})
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
        if self.schedule == "wsd" and self.warmup > stable_end(self):
            raise ValueError(f"--warmup {self.warmup} runs into the decay, which starts after update "
                             f"{stable_end(self)} (--max-steps {self.max_steps}, --decay {self.decay:g})")
        check_lm_tokenizer(self.tokenizer)
        parse_loggers(self.logger)
        if self.bin_dtype not in BIN_DTYPES:
            raise ValueError(f"unknown --bin-dtype {self.bin_dtype!r}; known: {', '.join(BIN_DTYPES)}")
        if len(self.adam_betas) != 2:
            raise ValueError(f"adam_betas takes two values, got {self.adam_betas}")
        if not self.corpus and not (self.train_file and self.valid_file) and not self.data_dir:
            raise ValueError("with --corpus '' give --train-file and --valid-file (or --data-dir a prepared folder)")
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


def documents(cfg: LMTrainConfig | dict[str, Any], split: str) -> Documents:
    """The text of a split, as the config names it (a config or its stored dict)."""
    where = cfg if isinstance(cfg, dict) else dataclasses.asdict(cfg)
    if where["corpus"]:
        return load_documents(where["corpus"], where["data_dir"] or None, split)
    path = where.get(f"{split}_file", "")
    if not path:
        raise ValueError(f"no --{split}-file given")
    return read_documents(path)


def prepared(cfg: LMTrainConfig | dict[str, Any]) -> Prepared | None:
    """The prepared folder ``--data-dir`` names (checked against the config's corpus and tokenizer), or None."""
    where = cfg if isinstance(cfg, dict) else dataclasses.asdict(cfg)
    if not is_prepared(where["data_dir"]):
        return None
    prep = read_prepared(where["data_dir"])
    check_prepared(prep, where["corpus"], where["tokenizer"], where["vocab_size"])
    return prep


def prepared_stream(prep: Prepared, split: str, tok: LMTokenizer | None, tokens: int = 0) -> Stream:
    """A split of a prepared folder, memory-mapped (the first documents holding ``tokens``, where given); ``tok``,
    where given, must be the folder's tokenizer."""
    if tok is not None and not same_tokenizer(tok, load_lm_tokenizer(prep.tokenizer_bytes())):
        raise ValueError(f"{prep.sidecar}: prepared with another tokenizer than the run's ({prep.tokenizer_spec})")
    info = prep.split(split)
    data = prep.tokens(split)
    if tokens:
        end, n_bytes, n_words = prep.first_documents(split, tokens)
        return Stream(data[:end], n_bytes, info["name"], n_words)
    return Stream(data, int(info["bytes"]), info["name"], int(info["words"]))


def same_tokenizer(a: LMTokenizer, b: LMTokenizer) -> bool:
    """Whether two tokenizers are one: the same stored form, or sentencepiece models with the same pieces in the
    same order (a trained model's bytes also hold the path it was trained at)."""
    if a.to_bytes() == b.to_bytes():
        return True
    return (isinstance(a, SubwordTokenizer) and isinstance(b, SubwordTokenizer) and a.vocab_size == b.vocab_size
            and all(a.tok.piece(i) == b.tok.piece(i) for i in range(a.vocab_size)))


def stream(cfg: LMTrainConfig | dict[str, Any], split: str, tok: LMTokenizer, tokens: int = 0) -> Stream:
    """A split's tokens: its documents encoded and joined (the first holding ``tokens``, where given), a prepared
    folder's shards, or .bin files as they are."""
    where = cfg if isinstance(cfg, dict) else dataclasses.asdict(cfg)
    prep = prepared(where)
    if prep is not None:
        return prepared_stream(prep, split, tok, tokens)
    path = where.get(f"{split}_file", "")
    if not where["corpus"] and path.endswith(".bin"):
        return read_bin(path, where["bin_dtype"], where["vocab_size"])
    docs = documents(where, split)
    if not tokens:  # one document's tokens at a time
        return token_stream((tok.encode_array(t) for t in docs.texts), tok.eot, tok.vocab_size, docs.n_bytes, docs.name,
                            count_words(docs.texts))
    encoded, total = [], 0  # the first documents holding ``tokens``
    for text in docs.texts:
        encoded.append(tok.encode_array(text))
        total += len(encoded[-1]) + 1
        if total >= tokens:
            break
    kept = Documents(docs.texts[: len(encoded)], docs.name)
    return token_stream(encoded, tok.eot, tok.vocab_size, kept.n_bytes, kept.name, count_words(kept.texts))


def vocabulary(cfg: LMTrainConfig) -> int:
    """The vocabulary size a fresh run of ``cfg`` gets: its prepared folder's tokenizer, the byte tokenizer's, a
    pretrained tokenizer's, or ``vocab_size`` (token files; a tokenizer trained by the run, at most that size)."""
    prep = prepared(cfg)
    if prep is not None:
        return load_lm_tokenizer(prep.tokenizer_bytes()).vocab_size
    if cfg.binary or cfg.tokenizer in ("bpe", "unigram"):
        return cfg.vocab_size
    if cfg.tokenizer == "bytes":
        return ByteTokenizer.vocab_size
    return load_lm_tokenizer(read_pretrained(cfg.tokenizer).to_bytes()).vocab_size


@torch.no_grad()
def evaluate(model, data: Stream, context: int, device, amp: bool, stride: int = 0, batch: int = 16,
             group: distributed.Group = distributed.Group(), progress: bool = False) -> dict[str, Any]:
    """Σ NLL of ``data`` (``nll``, nats), every target once (see skiplab.corpora.windows), and the three units
    it makes: bits per byte, per-token perplexity (of the model's tokens) and word perplexity:

        loss = nll / tokens,   bpb = nll / (ln 2 · bytes),   token_ppl = exp(loss),   word_ppl = exp(nll / words)

    (bpb and word_ppl None where the stream does not know its bytes or words). Under torchrun rank r scores
    batches r, r + N, ...; the sums are added in batch order, as one process adds them."""
    was_training = model.training
    model.eval()
    scores = []
    windows = list(eval_windows(data, context, stride, batch))
    for k, w in enumerate(tqdm(windows, desc=f"eval {data.name}", unit="batch", disable=not progress)):
        if k % group.world_size != group.rank:
            continue
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(w.inputs.to(device))
        nll = F.cross_entropy(logits.float().transpose(1, 2), w.targets.to(device), reduction="none")
        scores.append((k, float(nll[w.scored.to(device)].double().sum()), int(w.scored.sum())))
    nats = tokens = 0.0
    for _, n, t in sorted(s for rank_scores in group.gather(scores) for s in rank_scores):
        nats, tokens = nats + n, tokens + t
    model.train(was_training)
    loss = nats / tokens
    return {"loss": loss, "bpb": bits_per_byte(nats, data.n_bytes), "token_ppl": perplexity(nats, int(tokens)),
            "word_ppl": perplexity(nats, data.n_words), "nll": nats, "tokens": int(tokens), "bytes": data.n_bytes,
            "words": data.n_words or None}


def train(cfg: LMTrainConfig, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict[str, Any]:
    """Train as ``cfg`` says, writing the run directory (rank 0 alone, under torchrun); return the summary."""
    group, device = distributed.setup(pick_device(cfg.device))
    sharded.check(cfg, group)  # --fsdp: under torchrun
    if cfg.grad_accum % group.world_size:
        raise ValueError(f"--grad-accum {cfg.grad_accum} must be a multiple of the {group.world_size} processes "
                         "(each takes whole micro-batches)")
    prep = prepared(cfg)  # a prepared folder: its tokenizer and shards, nothing tokenised
    if prep is not None:  # its shards, its tokenizer and its document index checked before anything is written
        prep.tokenizer_bytes(), prep.tokens("train"), prep.tokens("valid")
        if cfg.valid_tokens:
            prep.first_documents("valid", cfg.valid_tokens)
    # token files are read (each scanned once) and their sidecars checked before anything is written
    token_files = (stream(cfg, "train", None), stream(cfg, "valid", None)) if cfg.binary else None
    pretrained = b""  # a pretrained tokenizer's file is read before anything is written: a bad one fails here
    saved = resume and (Path(cfg.out) / "last.pt").is_file()  # the tokenizer is the checkpoint's
    if cfg.tokenizer not in LM_TOKENIZERS and not (saved or cfg.binary or prep):
        pretrained = group.on_main(lambda: read_pretrained(cfg.tokenizer).to_bytes())
    run = Run(cfg, "lm", group, device, resume=resume, overwrite=overwrite)
    ckpt = run.resume(extendable=BUDGET + (("max_steps",) if cfg.schedule in ("constant", "wsd") else ()))
    if ckpt and cfg.schedule == "wsd" and ckpt["config"]["max_steps"] != cfg.max_steps:
        check_branch(ckpt, cfg)
    if ckpt:
        if cfg.max_steps < ckpt["step"]:
            raise run_dir.RunDirError(f"{run.out} has already trained {ckpt['step']} updates; a resumed run can only "
                                      "be given a larger budget")
        tok = checkpoint_tokenizer(ckpt)
    elif cfg.binary:
        tok = None
    elif prep is not None:  # the folder's; its model file beside the run, as a text run leaves one
        tok = load_lm_tokenizer(prep.tokenizer_bytes())
        if isinstance(tok, SubwordTokenizer):
            group.on_main(lambda: (run.out / "spm.model").write_bytes(tok.to_bytes()))
        elif not isinstance(tok, ByteTokenizer):
            group.on_main(lambda: tok.write(run.out))
    elif cfg.tokenizer == "bytes":  # nothing to learn
        tok = ByteTokenizer()
    elif pretrained:  # a copy of its file beside the run, as a trained one's spm.model
        tok = load_lm_tokenizer(pretrained)
        group.on_main(lambda: tok.write(run.out))
    else:  # rank 0 reads (downloads what is missing) and trains the tokenizer; every rank gets it
        data = group.on_main(lambda: train_lm_tokenizer(cfg.tokenizer, documents(cfg, "train").texts, run.out / "spm",
                                                        cfg.vocab_size).to_bytes())
        tok = load_lm_tokenizer(data)
    train_data, valid_data = token_files or group.main_first(lambda: (stream(cfg, "train", tok),
                                                                      stream(cfg, "valid", tok, cfg.valid_tokens)))
    vocab = tok.vocab_size if tok else cfg.vocab_size

    mcfg = cfg.model_config(vocab)
    torch.manual_seed(cfg.seed)
    model = build_model(mcfg).to(device)
    model.checkpointing = cfg.activation_checkpointing
    if group.rank:
        torch.manual_seed(cfg.seed + group.rank)  # dropout differs per rank; rank 0 goes on with the seed's stream
    net = run.compile(model)  # validates; ``model`` keeps plain names
    train_net = sharded.shard(net, model, group, run.amp) if cfg.fsdp else \
        distributed.data_parallel(net, group, torch.zeros(1, 2, dtype=torch.long, device=device))  # trains
    fused = device.type == "cuda"  # one kernel for the whole update where the device has it (CUDA); the CPU keeps
    # the default (foreach) kernels, whose numbers every recorded CPU run has
    param = parametrization.resolve(mcfg, cfg.parametrization)
    opt = torch.optim.AdamW(parameter_groups(model, cfg.weight_decay, param, cfg.adam_eps), lr=cfg.lr,
                            betas=tuple(cfg.adam_betas), eps=cfg.adam_eps, **({"fused": True} if fused else {}))
    run.attach(model, mcfg, opt, flops_per_token=model.flops_per_token())
    layers = LayerWatch(model, cfg.log_layers, run.watch.loggers)  # --log-layers (off at 0)
    gen = torch.Generator().manual_seed(cfg.seed)  # the windows, the same on every rank
    step, best = 0, math.inf
    if ckpt:
        run.restore(ckpt, key="step")
        layers.load_state(ckpt.get("layer_telemetry"))
        group.on_main(lambda: layer_telemetry.cut_lines(run.out, ckpt["step"]))  # what a killed run wrote past it
        step, best = ckpt["step"], ckpt["best_valid_loss"]
        gen.set_state(ckpt["rng"]["windows"])
    else:
        run.say(f"{train_data.name}: {len(train_data):,} training tokens, {valid_data.name}: {len(valid_data):,} "
                f"validation tokens; vocabulary {vocab}")
        first = torch.Generator().manual_seed(cfg.seed + 1)  # its own draws: the training stream is untouched
        run.profile(model, lambda: model(windows_at(train_data, window_starts(train_data, mcfg.context, cfg.batch_size,
                                                                              first), mcfg.context)[0].to(device)))
        run.write_config({"data": {"train": train_data.name, "train_tokens": len(train_data),
                                   "train_bytes": train_data.n_bytes, "valid": valid_data.name,
                                   "valid_tokens": len(valid_data), "valid_bytes": valid_data.n_bytes,
                                   "vocab_size": vocab, "tokenizer": cfg.tokenizer,
                                   "eot": tok.eot if tok else None},
                          "tokens_per_update": cfg.batch_size * cfg.grad_accum * mcfg.context,
                          "adamw_fused": fused, **design_notes(cfg, model),
                          **({"parametrization": {**param.notes(), "groups": parametrization.group_notes(opt)}}
                             if param.kind != "standard" else {})})
        for key, value in design_notes(cfg, model).items():
            run.say(f"{key.replace('_', ' ')}: {value}")

    n, per_update = mcfg.context, cfg.grad_accum
    mine = [k for k in range(per_update) if k % group.world_size == group.rank]  # this rank's micro-batches
    bar = tqdm(total=cfg.max_steps, initial=step, desc=Path(cfg.out).name, unit="step",
               disable=not (progress and group.main))
    window = {"loss": 0.0, "updates": 0, "time": time.time()}
    model.train()
    tokens_per_update = cfg.batch_size * per_update * n
    while step < cfg.max_steps:
        began = time.perf_counter()
        lr = learning_rate(cfg, step + 1)
        set_lr(opt, lr)  # times each group's lr_scale (mup, completep)
        opt.zero_grad(set_to_none=True)
        starts = [window_starts(train_data, n, cfg.batch_size, gen) for _ in range(per_update)]  # every rank draws all
        loss_sum = 0.0
        watched = layers.due(step + 1)
        with layers.watching() if watched else nullcontext():  # hooks on the watched updates alone
            for i, k in enumerate(mine):
                x, y = (t.to(device) for t in windows_at(train_data, starts[k], n))
                last = i == len(mine) - 1  # DDP averages the gradients over the ranks after the last only
                with nullcontext() if last or not group.active else train_net.no_sync():
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=run.amp):
                        logits = train_net(x)
                    loss = F.cross_entropy(logits.float().transpose(1, 2), y)
                    (loss * group.world_size / per_update).backward()
                loss_sum += loss.item()
        (update_loss,) = group.sum([loss_sum])
        update_loss /= per_update
        if not math.isfinite(update_loss):
            bar.close()
            run.watch.update(step + 1, update_loss, lr, math.nan, False, tokens_per_update,
                             time.perf_counter() - began, last=True)
            lines = layers.take()
            group.on_main(lambda: layer_telemetry.append_lines(run.out, lines))
            return run.diverged(update_loss, 1, step + 1)
        if watched:  # each sub-layer's gradient norm before clipping, its weights before the step
            layers.gradients()
            layers.snapshot()
        norm, clipped = grad_norm(list(model.parameters()), cfg.clip_norm)  # clips where clip_norm > 0
        opt.step()
        model.after_step()  # nGPT: its matrices back on the unit sphere; nothing for the other designs
        step += 1
        spikes = run.watch.spikes
        run.watch.update(step, update_loss, lr, norm, clipped, tokens_per_update, time.perf_counter() - began,
                         last=step == cfg.max_steps)
        if cfg.log_layers and run.watch.spikes > spikes:
            layers.note_spike(step)
        if watched:
            layers.update(step)
        window["loss"], window["updates"] = window["loss"] + update_loss, window["updates"] + 1
        bar.update(1)
        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            elapsed = time.time() - window["time"]
            valid = evaluate(net, valid_data, n, device, run.amp, group=sharded.eval_group(group, model))
            tokens = window["updates"] * cfg.batch_size * per_update * n
            record = {"step": step, "lr": lr, "train_loss": window["loss"] / window["updates"],
                      "valid_loss": valid["loss"], "valid_bpb": valid["bpb"], "valid_ppl": valid["token_ppl"],
                      "tokens_per_s": tokens / max(elapsed, 1e-9), "time": elapsed}
            improved = record["valid_loss"] < best
            best = min(best, record["valid_loss"])
            # no tokenizer (token files) is None: an empty bytes is what torch.load(weights_only=True) refuses
            state = run.checkpoint(record, rng={"windows": gen.get_state()}, step=step, best_valid_loss=best,
                                   tokenizer=tok.to_bytes() if tok else None, layer_telemetry=layers.state())
            lines = layers.take()  # before the checkpoint: a resume cuts what lies past it
            group.on_main(lambda: layer_telemetry.append_lines(run.out, lines))
            run.save(state, improved, step=step, keep=cfg.keep_checkpoints)
            bar.set_postfix(loss=f"{record['train_loss']:.3f}", valid=f"{record['valid_loss']:.3f}",
                            **({"bpb": f"{record['valid_bpb']:.3f}"} if record["valid_bpb"] else {}))
            window = {"loss": 0.0, "updates": 0, "time": time.time()}
    bar.close()
    return run.finish(lambda last: {"steps": step, "final_valid_loss": last["valid_loss"],
                                    "final_valid_bpb": last["valid_bpb"], "best_valid_loss": best,
                                    **design_notes(cfg, model), **layer_summary(cfg, run.out, layers)})


def layer_summary(cfg: LMTrainConfig, out: Path, layers: LayerWatch) -> dict[str, Any]:
    """With --log-layers, the summary's ``spike_sources``: for every flagged spike, the sub-layers whose gradient
    norms rose first (:func:`~skiplab.train.layer_telemetry.spike_sources`); empty without it."""
    if not cfg.log_layers:
        return {}
    return {"spike_sources": layer_telemetry.spike_sources(layer_telemetry.read_lines(out), layers.spikes)}


def design_notes(cfg: LMTrainConfig, model: torch.nn.Module) -> dict[str, Any]:
    """What a run of ``cfg`` does for its design, for config.json and summary.json: ``design_recipe``, the training
    fields the design prescribes (and the config holds where they were left at their defaults), and ``after_step``,
    what the model does after every update (:meth:`~skiplab.models.gpt.GPT.after_step`); empty for most designs."""
    recipe, after = design_recipe(cfg.model), model.after_step_does
    return {**({"design_recipe": recipe} if recipe else {}), **({"after_step": after} if after else {})}


def check_branch(ckpt: dict[str, Any], cfg: LMTrainConfig) -> None:
    """A wsd run goes on to another budget only from its stable phase: every update it made had the lr of both
    budgets (its step <= both stable ends); else a one-line error."""
    _check_stable(ckpt, cfg.max_steps, str(cfg.out))


def _check_stable(ckpt: dict[str, Any], max_steps: int, where: str) -> None:
    before, decay = ckpt["config"]["max_steps"], ckpt["config"].get("decay", 0.2)
    last = min(before - round(decay * before), max_steps - round(decay * max_steps))
    if ckpt["step"] > last:
        raise run_dir.RunDirError(
            f"{where}: the checkpoint is at update {ckpt['step']}, past the stable phase (to update {last}) that "
            f"--max-steps {before} and {max_steps} share; branch from a checkpoint at or before it")


def branch(source: str | Path, out: str | Path, overwrite: bool = False, max_steps: int = 0) -> Path:
    """A new run directory ``out`` going on from the step checkpoint ``source`` of a wsd run (``train lm --branch``):
    the checkpoint as its last.pt, its config.json, its metrics and steps (which the resume cuts at the checkpoint);
    ``train lm --resume --out OUT --max-steps M`` then decays it to M updates (``max_steps``).

    Everything is checked before anything is written or removed: the checkpoint (a wsd run's, in its stable phase
    for ``max_steps``), the config.json beside it (the config of the run that wrote it), and ``out``, which is
    replaced only with ``overwrite`` and only where it holds a run (as :func:`run_dir.prepare` rules). A branch of
    the same checkpoint that has not saved since it was made (its start failed) is made again without
    ``overwrite``, so that the same command runs once its input is fixed. The source is not changed."""
    source, out = Path(source), Path(out)
    if source.is_dir():
        source = source / "last.pt"
    ckpt = run_dir.load_checkpoint(source, kind="lm")
    if ckpt["config"].get("schedule") != "wsd":
        raise ValueError(f"{source}: a run of the {ckpt['config'].get('schedule')} schedule; --branch takes a "
                         "checkpoint of a --schedule wsd run")
    _check_stable(ckpt, max_steps or ckpt["config"]["max_steps"], str(source))
    beside = source.parent / "config.json"
    if not beside.is_file():
        raise FileNotFoundError(f"{beside}: no such file; --branch takes a step checkpoint inside the directory of "
                                "the run that wrote it (its config.json beside it)")
    stored = run_dir.read_json(beside)
    if not isinstance(stored, dict) or not isinstance(stored.get("config"), dict):
        raise run_dir.RunDirError(f"{beside}: not a run's config.json (no \"config\" object)")
    defaults = {f.name: f.default for f in dataclasses.fields(LMTrainConfig)}
    other = run_dir.changed_settings({**defaults, **stored["config"]}, {**defaults, **ckpt["config"]},
                                     ignore=run_dir.PLACE + BUDGET + ("max_steps",))
    if other:
        raise run_dir.RunDirError(f"{beside}: the config of another run than {source.name}'s (different "
                                  f"{', '.join(other)}); --branch takes a step checkpoint inside the directory of "
                                  "the run that wrote it")
    again = _unsaved_branch(out, source)
    if not again and out.exists() and any(p.name != run_dir.LOCK for p in out.iterdir()):
        if not overwrite:
            raise run_dir.RunDirError(f"{out} exists; use --overwrite to replace it")
        if not (out / "config.json").is_file():
            raise run_dir.RunDirError(f"{out} is not a skiplab run directory (no config.json); refusing to "
                                      "overwrite it")
    if again:
        print(f"{out}: a branch of {source} that has not saved since it was made; made again")
    run_dir.prepare(out, overwrite=True)  # held by this process (and the training that follows); its files removed
    step = ckpt["step"]
    run_dir.write_json(out / "config.json", {**stored, "branched_from": {"checkpoint": str(source.resolve()),
                                                                        "step": step}})
    for name in ("metrics.jsonl", run_dir.STEPS_FILE, run_dir.LAYERS_FILE):  # whole: the resume cuts them
        if (source.parent / name).is_file():
            shutil.copyfile(source.parent / name, out / name)
    shutil.copyfile(source, out / "last.pt")
    return out


def _unsaved_branch(out: Path, source: Path) -> bool:
    """Whether ``out`` holds a branch of the checkpoint ``source`` whose last.pt is still that checkpoint."""
    try:
        made = json.loads((out / "config.json").read_text()).get("branched_from", {})
        return made.get("checkpoint") == str(source.resolve()) and filecmp.cmp(source, out / "last.pt", shallow=False)
    except (OSError, ValueError, AttributeError):
        return False


def checkpoint_tokenizer(ckpt: dict[str, Any]) -> LMTokenizer | None:
    """The tokenizer a checkpoint holds (None: a run on pre-tokenised .bin files)."""
    data = ckpt.get("tokenizer")
    return load_lm_tokenizer(data) if data else None


def load_run(path: str | Path, average: int = 0) -> tuple[dict[str, Any], torch.nn.Module, LMTokenizer | None]:
    """(checkpoint, model in evaluation mode on the CPU, tokenizer) of a run directory or checkpoint file;
    with ``average`` > 1, the average of the run's last ``average`` step checkpoints."""
    ckpt = run_dir.average_checkpoints(path, average, kind="lm")[0] if average > 1 \
        else run_dir.load_checkpoint(path, kind="lm")
    model = model_from_checkpoint(ckpt, path)
    return ckpt, model.eval(), checkpoint_tokenizer(ckpt)


def evaluate_checkpoint(path: str | Path, split: str = "test", average: int = 0, stride: int = 0, data_dir: str = "",
                        device: str = "auto", progress: bool = True) -> dict[str, Any]:
    """A trained run on a split of its corpus, in the field's units (:func:`evaluate`): bits per byte, per-token
    perplexity of the run's tokenizer, word perplexity (lm-evaluation-harness's ``word_perplexity``), each with
    its count, and ``covers``, what text the counts are of."""
    ckpt, model, tok = load_run(path, average)
    where = {**ckpt["config"], **({"data_dir": data_dir} if data_dir else {})}
    dev = pick_device(device)
    data = stream(where, split, tok)
    result = evaluate(model.to(dev), data, model.cfg.context, dev, where["amp"] and dev.type == "cuda", stride,
                      progress=progress)
    return {"checkpoint": str(path), "step": ckpt.get("step"), "averaged": max(1, average), "model": where["model"],
            "tokenizer": where["tokenizer"], "split": data.name, "stride": stride or model.cfg.context, **result,
            "covers": coverage(data, model.cfg.context, stride)}


def coverage(data: Stream, context: int, stride: int = 0) -> str:
    """What the counts of :func:`evaluate` are of, in words."""
    windows = (f"sliding windows of {context} tokens, each scoring its last {stride}" if stride and stride < context
               else f"windows of {context} tokens that do not overlap")
    text = ("bytes and words: the documents' text, separators aside" if data.n_words else
            "bytes: as the token files' sidecars or the prepared folder record them; words unknown "
            "(no word perplexity)")
    return (f"{data.name}: its documents, each followed by the end-of-text token, in one stream of {len(data)} tokens; "
            f"NLL over every token but the stream's first ({len(data) - 1} targets, end-of-text tokens included), "
            f"each once, in {windows}; {text}")


def unigram_baseline(cfg: LMTrainConfig, split: str = "test") -> dict[str, Any] | None:
    """Loss and bits per byte on a split of ``cfg``'s corpus of the unigram model of its training split, in the
    tokens of ``cfg``'s finished run (:func:`skiplab.corpora.windows.unigram_nats`): the level of a model that
    ignores context, against which a run that trained can be told from one that stalled. Bytes and .bin files
    need no checkpoint; a subword tokenizer is read from the run's (None where it has none)."""
    prep = prepared(cfg)
    if cfg.binary:
        tok = None
    elif prep is not None:
        tok = load_lm_tokenizer(prep.tokenizer_bytes())
    elif cfg.tokenizer == "bytes":
        tok = ByteTokenizer()
    elif (Path(cfg.out) / "last.pt").is_file():
        tok = checkpoint_tokenizer(run_dir.load_checkpoint(cfg.out, kind="lm"))
    else:
        return None
    vocab = tok.vocab_size if tok else cfg.vocab_size
    train_data, data = stream(cfg, "train", tok), stream(cfg, split, tok)
    nats, targets = unigram_nats(train_data, data, vocab), max(0, len(data) - 1)
    return {"split": data.name, "loss": nats / targets if targets else math.nan,
            "bpb": bits_per_byte(nats, data.n_bytes), "tokens": targets, "bytes": data.n_bytes}
