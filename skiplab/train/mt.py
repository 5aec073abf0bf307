"""Machine translation with any model: the Transformer recipe of Vaswani et al. (2017) as the papers use it.

Adam (β = 0.9, 0.98, ε = 1e-9), inverse-square-root schedule after a linear warm-up (4000 steps; 8000 in
the depth-wise LSTM paper) whose peak is given (``--schedule inverse_sqrt``, fairseq's form: ``--lr``) or
derived (``--schedule vaswani``: Eq. 3 of Vaswani et al., peak d_model^-0.5 · warmup^-0.5; config.json
records the resolved peak), label-smoothed cross-entropy (ε = 0.1), batches of about ``max_tokens``
tokens with ``update_freq`` accumulation, optional gradient clipping; training by steps or epochs;
a checkpoint every ``save_every`` steps (the last ``keep_checkpoints`` kept, for averaging). A joint
sentencepiece model is trained on the training side and stored in every checkpoint, so a checkpoint
translates raw text on its own. The loop below is the whole of training, for translation and for captioning
(skiplab.train.caption): :func:`train_seq2seq` takes a task's data as :class:`Seq2SeqData` (batches of a
source, images for captions, and target ids) and, where a task has one, another objective (self-critical
training).

Under torchrun (see ``skiplab.distributed``) the token batches are dealt to the N ranks: an update takes
the N · update_freq consecutive batches that one process with ``--update-freq N·update_freq`` would take,
rank r the r-th run of ``update_freq`` of them, accumulated with DDP's ``no_sync`` until the last. The
summed loss is normalised by the update's global count of target tokens (the tokens of all N ·
update_freq batches, which every rank knows, as every rank builds the same batch order); DDP averages
the ranks' gradients, so each rank divides its sum by T / N:

    g = (1/N) Σ_r ∇ L_r  ·  N / T  =  ∇ (Σ_r L_r) / T,    T = Σ_{all N·update_freq batches} target tokens,

the gradient one process with ``--update-freq N·update_freq`` computes over the same batches (with
dropout off, the same update).
"""

from __future__ import annotations

import dataclasses
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch
from tqdm import tqdm

from ..models import PRESETS, Seq2SeqConfig, build_model, family_of, model_config, seq2seq_families
from ..corpora import encode_parallel, filter_long, load_split, make_batches
from ..tokenization import Tokenizer
from ..corpora.parallel import Parallel
from .. import distributed, run_dir
from ..config import check_bounds
from ..interop.loggers import parse_loggers
from ..device import pick_device
from .run import Run
from .telemetry import grad_norm
from .recipe_mt import SCHEDULES, label_smoothed_loss, peak_lr, schedule_lr


@dataclass(frozen=True)
class Seq2SeqRecipe:
    """The Transformer recipe's settings, shared by every encoder-decoder task (translation, captioning)."""

    update_freq: int = field(default=1, metadata={"min": 1, "help": "batches accumulated per update"})
    schedule: str = field(default="inverse_sqrt", metadata={
        "help": "learning-rate schedule: inverse_sqrt (linear warm-up to --lr, then ∝ step^-0.5) or vaswani "
                "(Vaswani et al. 2017 Eq. 3: d_model^-0.5 · min(s^-0.5, s · warmup^-1.5), peak d_model^-0.5 · "
                "warmup^-0.5 from the model and --warmup; --lr is not used), or constant (linear warm-up to --lr, "
                "then --lr)"})
    lr: float = field(default=5e-4, metadata={
        "help": "peak learning rate, reached at the end of warm-up (--schedule inverse_sqrt; not used by vaswani)"})
    warmup: int = field(default=4000, metadata={"min": 0, "help": "linear warm-up steps (8000 in the depth-wise LSTM paper)"})
    adam_betas: tuple[float, ...] = field(default=(0.9, 0.98), metadata={"help": "Adam β1, β2"})
    adam_eps: float = field(default=1e-9, metadata={"help": "Adam ε"})
    weight_decay: float = field(default=0.0, metadata={
        "min": 0.0, "help": "decoupled weight decay (AdamW); 0 = plain Adam"})
    label_smoothing: float = field(default=0.1, metadata={"help": "ε of the label-smoothed cross-entropy"})
    clip_norm: float = field(default=0.0, metadata={"min": 0.0, "help": "clip the gradient norm to this (0 = off)"})
    max_steps: int = field(default=0, metadata={"min": 0, "help": "updates to train for (0 = use --epochs)"})
    epochs: int = field(default=0, metadata={"min": 0, "help": "epochs to train for when --max-steps is 0"})
    save_every: int = field(default=1000, metadata={"min": 1, "help": "validate and save a checkpoint every N updates"})
    log_every: int = field(default=1, metadata={
        "min": 0, "help": "a line of steps.jsonl every N updates: loss per target token, lr, gradient norm, clipped, "
                          "spike, target tokens/s (0 = none; spikes and the largest gradient norm still go to the "
                          "summary)"})
    logger: str = field(default="", metadata={
        "help": "also send the lines to tensorboard, wandb or trackio (comma-separated; each its own package)"})
    keep_checkpoints: int = field(default=10, metadata={"min": 1, "help": "step checkpoints kept (for averaging)"})
    seed: int = field(default=1, metadata={"help": "seed for initialisation, batch order and dropout"})
    device: str = field(default="auto", metadata={"help": "cpu, cuda, cuda:1, or auto"})
    amp: bool = field(default=True, metadata={"help": "bf16 autocast on CUDA (ignored on CPU)"})
    sync_bn: bool = field(default=False, metadata={
        "help": "under torchrun, BatchNorm statistics (the captioner's image trunk) over every process's batch"})
    compile: bool = field(default=False, metadata={
        "help": "run the model through torch.compile (dynamic shapes: batch shapes vary)"})
    out: str = field(default="runs/mt", metadata={"help": "run directory"})

    def __post_init__(self):
        check_bounds(self)
        parse_loggers(self.logger)
        if (self.max_steps > 0) == (self.epochs > 0):
            raise ValueError("give exactly one of --max-steps and --epochs (> 0)")
        if self.lr <= 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; known: {', '.join(SCHEDULES)}")
        if self.schedule == "vaswani" and self.warmup < 1:
            raise ValueError(f"--schedule vaswani needs --warmup >= 1 (its peak is d_model^-0.5 · warmup^-0.5), "
                             f"got {self.warmup}")
        if len(self.adam_betas) != 2:
            raise ValueError(f"adam_betas takes two values, got {self.adam_betas}")
        if not 0 <= self.label_smoothing < 1:  # ε >= 1 rewards making the right word unlikely; NaN fails here too
            raise ValueError(f"--label-smoothing must be in [0, 1), got {self.label_smoothing}")


@dataclass(frozen=True)
class MTTrainConfig(Seq2SeqRecipe):
    """Everything that decides a translation run; saved as config.json beside its results."""

    model: str = field(default="transformer-small", metadata={
        "help": "model spec: a preset, optionally with options, e.g. dwlstm-small(share=all) or "
                "transformer-small(connection=2rSkip+LN); the model options below add to it"})
    corpus: str = field(default="multi30k", metadata={
        "help": "corpus spec: multi30k, iwslt15-en-vi, wmt14-en-de (valid newstest2013; "
                "wmt14-en-de(valid=newstest2012+newstest2013) for both years), or '' to use --*-prefix files"})
    data_dir: str = field(default="", metadata={"help": "where the corpus files are ('' = the default place)"})
    train_prefix: str = field(default="", metadata={"help": "with --corpus '': PREFIX.SRC / PREFIX.TGT for training"})
    valid_prefix: str = field(default="", metadata={"help": "with --corpus '': validation files"})
    test_prefix: str = field(default="", metadata={"help": "with --corpus '': test files"})
    src: str = field(default="en", metadata={"help": "source language"})
    tgt: str = field(default="de", metadata={"help": "target language"})
    train_subset: int = field(default=0, metadata={"min": 0, "help": "train on the first N pairs (0 = all)"})
    vocab_size: int = field(default=8000, metadata={"min": 1, "help": "joint subword vocabulary size (an upper bound)"})
    subword: str = field(default="bpe", metadata={"help": "sentencepiece model type: bpe or unigram"})
    max_len: int = field(default=256, metadata={"min": 1, "help": "drop training pairs with a side longer than this (tokens)"})
    max_tokens: int = field(default=4096, metadata={"min": 1, "help": "tokens per batch (padding included)"})

    def __post_init__(self):
        super().__post_init__()
        if not self.corpus and not (self.train_prefix and self.valid_prefix):
            raise ValueError("with --corpus '' give --train-prefix and --valid-prefix")
        given = [f"--{k.replace('_', '-')}" for k in ("train_prefix", "valid_prefix", "test_prefix") if getattr(self, k)]
        if self.corpus and given:  # the corpus's own files would be read, and the prefixes recorded beside them
            raise ValueError(f"{', '.join(given)} name files of your own, read with --corpus '' only; this run names "
                             f"--corpus {self.corpus}")
        if family_of(self.model) not in seq2seq_families():
            raise ValueError(f"{self.model} is not a translation model; known: "
                             f"{', '.join(n for n, (c, _) in PRESETS.items() if c in seq2seq_families())}")
        positions = self.model_config(100).max_positions  # a bad spec or option fails here, before anything is written
        if self.max_len > positions:
            raise ValueError(f"--max-len {self.max_len} is more than the model's positions cover (max_positions "
                             f"{positions}); lower --max-len or raise --max-positions")

    def model_config(self, vocab_size: int) -> Seq2SeqConfig:
        """The model's config, resolved from the spec, for a subword vocabulary of ``vocab_size``."""
        return model_config(self.model, vocab_size=vocab_size, pad_id=Tokenizer.PAD)


# Nothing in the recipe depends on these (the inverse-square-root schedule has no end), so a run resumed
# with a larger budget makes exactly the updates a run given that budget from the start would have made.
BUDGET = ("max_steps", "epochs", "keep_checkpoints")


@torch.no_grad()
def validate(model, batches, eps: float, device, amp: bool,
             group: distributed.Group = distributed.Group()) -> dict[str, float]:
    """Per-token loss, NLL and perplexity over ``batches``. Under torchrun rank r scores batches r, r + N, ...;
    the per-batch sums are gathered and added in batch order, as one process adds them."""
    model.eval()
    scores = []
    for k, b in enumerate(batches):
        if k % group.world_size != group.rank:
            continue
        b = b.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(b.src, b.tgt_in)
        l, n = label_smoothed_loss(logits, b.tgt_out, eps, Tokenizer.PAD)
        scores.append((k, l.item(), n.item(), b.ntokens))
    loss = nll = tokens = 0.0
    for _, l, n, t in sorted(s for rank_scores in group.gather(scores) for s in rank_scores):
        loss, nll, tokens = loss + l, nll + n, tokens + t
    model.train()
    return {"valid_loss": loss / tokens, "valid_nll": nll / tokens, "valid_ppl": math.exp(min(nll / tokens, 50))}


@dataclass
class Seq2SeqData:
    """What the encoder-decoder loop trains on, whatever the source side is (sentences, images, features).

    A batch has ``src``, ``tgt_in`` (BOS + y), ``tgt_out`` (y + EOS), ``ntokens`` (its non-PAD targets) and
    ``to(device)``; ``batches(shuffle, generator)`` is one epoch's, drawn from ``generator`` alone (so a resumed
    run redraws an epoch's order from its starting RNG state)."""

    name: str  # the training data, for the first line and config.json
    vocab_size: int
    vocab: bytes  # the target vocabulary (a subword model, a word list) stored in every checkpoint as "tokenizer"
    batches: Callable[[bool, torch.Generator | None], list[Any]]
    valid: list[Any]  # validation batches
    example: tuple[Any, Any]  # (src, tgt_in) of one example: DDP's first call
    info: dict[str, Any]  # config.json's "data"
    said: str  # the first line of a fresh run
    # another objective than the label-smoothed cross-entropy: (the net that trains, the model, a batch on the
    # device) -> the batch's summed loss, normalised like it by the update's ``ntokens`` (self-critical training)
    objective: Callable[[Any, Any, Any], torch.Tensor] | None = None
    init: dict[str, torch.Tensor] | None = None  # the weights a fresh run starts from (None: the initialisation)
    generators: dict[str, torch.Generator] = field(default_factory=dict)  # the objective's, saved and resumed


class MTSource:
    """Parallel text through a joint subword model: the translation task's :class:`Seq2SeqData`."""

    def __init__(self, cfg: MTTrainConfig, group: distributed.Group):
        self.cfg = cfg
        where = dataclasses.asdict(cfg)
        # rank 0 reads (downloads what is missing) first
        self.train_data, self.valid_data = group.main_first(lambda: (load_split(where, "train"),
                                                                    load_split(where, "valid")))
        if cfg.train_subset:
            self.train_data = Parallel(self.train_data.src[: cfg.train_subset], self.train_data.tgt[: cfg.train_subset],
                                       self.train_data.name)

    def prepare(self, run: Run, group: distributed.Group, ckpt: dict[str, Any] | None) -> Seq2SeqData:
        cfg, train_data, valid_data = self.cfg, self.train_data, self.valid_data
        if ckpt:
            tok = Tokenizer.from_bytes(ckpt["tokenizer"])
        else:  # rank 0 trains the tokenizer (its files go in the run directory) and hands it to every rank
            spm = group.on_main(lambda: Tokenizer.train(train_data.src + train_data.tgt, run.out / "spm",
                                                        cfg.vocab_size, cfg.subword).to_bytes())
            tok = Tokenizer.from_bytes(spm)
        train_src, train_tgt = encode_parallel(tok, train_data)
        kept, dropped = filter_long(train_src, train_tgt, cfg.max_len)
        valid_src, valid_tgt = encode_parallel(tok, valid_data)
        valid_kept, _ = filter_long(valid_src, valid_tgt, cfg.max_len)
        for split, left, n in (("training", kept, len(train_src)), ("validation", valid_kept, len(valid_src))):
            if n and not left:
                raise ValueError(f"--max-len {cfg.max_len} drops every one of the {n} {split} pairs (each has a side of "
                                 f"more than {cfg.max_len} tokens with EOS/BOS); raise --max-len")
        longest = max((max(len(src[i]), len(tgt[i])) + 1 for src, tgt, kept_ in ((train_src, train_tgt, kept),
                       (valid_src, valid_tgt, valid_kept)) for i in kept_), default=0)  # with EOS/BOS
        if longest > cfg.max_tokens:
            raise ValueError(f"a pair kept has {longest} tokens a side (with EOS/BOS), more than a batch of "
                             f"--max-tokens {cfg.max_tokens} holds; raise --max-tokens or set --max-len "
                             f"{cfg.max_tokens} (pairs longer than --max-len are dropped)")
        example = torch.tensor([[Tokenizer.UNK, Tokenizer.EOS]])
        return Seq2SeqData(
            train_data.name, tok.vocab_size, tok.to_bytes(),
            lambda shuffle, gen: make_batches(train_src, train_tgt, cfg.max_tokens, kept, shuffle=shuffle,
                                              generator=gen),
            make_batches(valid_src, valid_tgt, cfg.max_tokens, valid_kept), (example, example),
            {"train": train_data.name, "train_pairs": len(kept), "dropped_long": dropped, "valid": valid_data.name,
             "valid_pairs": len(valid_data), "vocab_size": tok.vocab_size},
            f"{train_data.name}: {len(kept)} training pairs, {dropped} dropped as longer than {cfg.max_len} "
            f"tokens; vocabulary {tok.vocab_size}")


def train(cfg: MTTrainConfig, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict[str, Any]:
    """Train a translation run as ``cfg`` says, writing the run directory (rank 0 alone, under torchrun); return
    the summary."""
    return train_seq2seq(cfg, "mt", MTSource, resume, overwrite, progress)


def train_seq2seq(cfg: Any, kind: str, source: Callable[[Any, distributed.Group], Any], resume: bool = False,
                  overwrite: bool = False, progress: bool = True) -> dict[str, Any]:
    """The loop of every encoder-decoder task: ``source(cfg, group)`` reads the data (before anything is
    written) and its ``prepare(run, group, checkpoint)`` gives the :class:`Seq2SeqData`; ``kind`` is the
    checkpoints' task."""
    group, device = distributed.setup(pick_device(cfg.device))
    loaded = source(cfg, group)
    run = Run(cfg, kind, group, device, resume=resume, overwrite=overwrite)
    amp = run.amp

    ckpt = run.resume(extendable=BUDGET)
    if ckpt and ((cfg.max_steps and cfg.max_steps < ckpt["step"]) or (cfg.epochs and cfg.epochs < ckpt["epoch"])):
        raise run_dir.RunDirError(f"{run.out} has already trained {ckpt['step']} updates ({ckpt['epoch']} epochs); "
                                  "a resumed run can only be given a larger budget")
    data = loaded.prepare(run, group, ckpt)

    mcfg = cfg.model_config(data.vocab_size)
    peak = peak_lr(cfg.schedule, cfg.lr, mcfg.d_model, cfg.warmup)  # both schedules: inverse_sqrt_lr's curve
    torch.manual_seed(cfg.seed)
    model = build_model(mcfg).to(device)
    if data.init is not None and not ckpt:
        model.load_state_dict(data.init)
    if group.rank:
        torch.manual_seed(cfg.seed + group.rank)  # dropout differs per rank; rank 0 goes on with the seed's stream
    if cfg.sync_bn and group.active:
        distributed.sync_batch_norm(model)
    net = run.compile(model, dynamic=True)  # validates; ``model`` keeps plain names
    train_net = distributed.data_parallel(net, group, *(t.to(device) for t in data.example))  # trains
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps,
                            weight_decay=cfg.weight_decay)
    run.attach(model, mcfg, opt)
    gen = torch.Generator().manual_seed(cfg.seed)  # batch order, the same on every rank
    step, epoch, batch_pos, best = 0, 0, 0, math.inf
    epoch_rng = gen.get_state()
    valid_batches = data.valid

    run.generators.update(data.generators)
    if ckpt:
        run.restore(ckpt, key="step")
        step, epoch, batch_pos, best = ckpt["step"], ckpt["epoch"], ckpt["batch_pos"], ckpt["best_valid_loss"]
        epoch_rng = ckpt["rng"]["epoch"]
    else:
        run.say(data.said)
        first = data.batches(False, None)[0].to(device)  # unshuffled: no draw
        inputs = (first.src, first.tgt_in) if data.objective is None else tuple(t.to(device) for t in data.example)
        run.profile(model, lambda: model(*inputs))
        run.write_config({"schedule": {"name": cfg.schedule, "peak_lr": peak, "warmup": cfg.warmup},
                          "data": data.info})

    span = cfg.update_freq * group.world_size  # batches per update, over all ranks
    mine = slice(group.rank * cfg.update_freq, (group.rank + 1) * cfg.update_freq)  # this rank's of an update's
    batches_per_epoch = len(data.batches(False, None))
    total = cfg.max_steps or cfg.epochs * (batches_per_epoch // span)  # a partial last group is dropped
    bar = tqdm(total=total, initial=step, desc=Path(cfg.out).name, unit="step", disable=not (progress and group.main))
    window = {"loss": 0.0, "tokens": 0, "time": time.time()}
    model.train()
    while step < total:
        gen.set_state(epoch_rng)  # the epoch's batch order follows from its starting RNG state alone
        order = data.batches(True, gen)
        next_epoch_rng = gen.get_state()
        while batch_pos + span <= len(order) and step < total:
            update = order[batch_pos : batch_pos + span]
            began = time.perf_counter()
            lr = schedule_lr(cfg.schedule, step + 1, peak, cfg.warmup)
            for g in opt.param_groups:
                g["lr"] = lr
            opt.zero_grad(set_to_none=True)
            ntokens, loss_sum = sum(b.ntokens for b in update), 0.0  # ntokens: the update's, over all ranks
            for i, b in enumerate(update[mine]):
                b = b.to(device)
                last = i == cfg.update_freq - 1  # DDP averages the gradients over the ranks after the last only
                with nullcontext() if last or not group.active else train_net.no_sync():
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                        if data.objective is not None:
                            loss = data.objective(train_net, model, b)
                        else:
                            logits = train_net(b.src, b.tgt_in)
                    if data.objective is None:
                        loss, _ = label_smoothed_loss(logits, b.tgt_out, cfg.label_smoothing, Tokenizer.PAD)
                    value = loss.item()
                    (every_rank,) = group.sum([value])  # non-finite if any rank's is: all stop together
                    if not math.isfinite(every_rank):
                        bar.close()
                        run.watch.update(step + 1, every_rank, lr, math.nan, False, ntokens,
                                         time.perf_counter() - began, last=True)
                        return run.diverged(every_rank, epoch + 1, step + 1)
                    loss.backward()
                loss_sum += value
            for p in model.parameters():  # the loss is a sum: normalise by the update's target tokens (see above)
                if p.grad is not None:
                    p.grad.div_(ntokens / group.world_size)
            norm, clipped = grad_norm(list(model.parameters()), cfg.clip_norm)  # clips where clip_norm > 0
            opt.step()
            step, batch_pos = step + 1, batch_pos + span
            (update_loss,) = group.sum([loss_sum])
            run.watch.update(step, update_loss / max(ntokens, 1), lr, norm, clipped, ntokens,
                             time.perf_counter() - began, last=step == total)
            window["loss"], window["tokens"] = window["loss"] + loss_sum, window["tokens"] + ntokens
            bar.update(1)
            if step % cfg.save_every == 0 or step == total:
                elapsed = time.time() - window["time"]
                (window_loss,) = group.sum([window["loss"]])
                valid = validate(net, valid_batches, cfg.label_smoothing, device, amp, group)
                if not math.isfinite(valid["valid_loss"]):  # the last updates left weights that are not finite
                    bar.close()
                    return run.diverged(valid["valid_loss"], epoch + 1, step, what="validation loss")
                record = {"step": step, "epoch": epoch + batch_pos / len(order), "lr": lr,
                          "train_loss": window_loss / max(window["tokens"], 1), **valid,
                          "tokens_per_s": window["tokens"] / max(elapsed, 1e-9), "time": elapsed}
                improved = record["valid_loss"] < best
                best = min(best, record["valid_loss"])
                closed = batch_pos + span > len(order)
                if closed:  # the epoch is over: a resume starts the next, and so does this run (below)
                    epoch, batch_pos, epoch_rng = epoch + 1, 0, next_epoch_rng
                state = run.checkpoint(record, rng={"epoch": epoch_rng}, step=step, epoch=epoch, batch_pos=batch_pos,
                                       best_valid_loss=best, tokenizer=data.vocab)
                run.save(state, improved, step=step, keep=cfg.keep_checkpoints)
                bar.set_postfix(loss=f"{record['train_loss']:.3f}", valid=f"{record['valid_loss']:.3f}",
                                ppl=f"{record['valid_ppl']:.1f}")
                window = {"loss": 0.0, "tokens": 0, "time": time.time()}
                if closed:  # the next epoch's order from its own RNG state (it walked this order again)
                    break
        if batch_pos + span > len(order):
            epoch, batch_pos, epoch_rng = epoch + 1, 0, next_epoch_rng
    bar.close()
    return run.finish(lambda last: {"steps": step, "epochs": round(epoch + batch_pos / max(batches_per_epoch, 1), 3),
                                    "final_valid_loss": last["valid_loss"], "final_valid_ppl": last["valid_ppl"],
                                    "best_valid_loss": best})


def checkpoint_step(path: Path) -> int:
    """The step in ``checkpoint_<step>.pt``."""
    return int(path.stem.split("_")[-1])
