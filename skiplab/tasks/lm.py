"""Language modelling: the decoder-only family with any connection (skiplab.train.lm), generation.

Blocks are the decoder layers, ``layer.i``; compare's metric is the test bits per byte of the final
model, lower is better; an example is a window of ``context`` tokens and L_n the sum of its tokens'
cross-entropies.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import distributed, run_dir
from ..analysis.trained import Examples, Trained
from .. import config
from ..config import count
from ..connections import connection
from ..models import build_model, lm_families, with_options
from ..models.generate import generate
from ..tokenization.lm import LM_TOKENIZERS
from ..corpora.prepare import PrepareConfig, prepare
from ..tokenization.pretrained import read_pretrained
from ..corpora.shards import read_prepared
from ..corpora.windows import eval_windows, sample_windows
from ..train import lm, lm_branch, lm_data, parametrization
from .base import Task
from .model_options import given_family_options


class LMTrained(Trained):
    kind = "lm"
    splits = ("train", "valid", "test")
    stacks = {"layer": "layers"}
    metric, metric_title, higher_is_better = "bpb", "bits per byte", False
    scored_unit = "tokens"  # score_test counts target tokens

    def losses(self, ex: Examples, output: Tensor) -> Tensor:
        nll = F.cross_entropy(output.float().transpose(1, 2), ex.target, reduction="none")
        return nll.sum(1)

    def units(self, ex: Examples) -> Tensor:
        """Target tokens: training averages per token."""
        return torch.tensor(ex.target.numel())

    def examples(self, split: str, count: int, seed: int = 0, batch: int = 250, max_tokens: int = 4096,
                 data_dir: str = "", shuffle: bool = False) -> Iterator[Examples]:
        """Windows of ``context`` tokens: consecutive from the split's start (``shuffle`` false), or at random
        offsets; ``batch`` windows at a time (at most ``max_tokens`` tokens)."""
        self.check_split(split)
        where = {**self.config, **({"data_dir": data_dir} if data_dir else {})}
        data = lm_data.stream(where, split, lm_data.checkpoint_tokenizer(self.checkpoint))
        n = self.model.cfg.context
        rows = max(1, min(batch, max_tokens // n))
        if shuffle:
            gen = torch.Generator().manual_seed(seed)
            for i in range(0, count, rows):
                x, y = sample_windows(data, n, min(rows, count - i), gen)
                yield Examples((x,), y, {"layer": torch.ones_like(x, dtype=torch.bool)})
            return
        seen = 0
        for w in eval_windows(data, n, batch=rows):
            keep = w.scored.all(1)  # whole windows only (the last may be short)
            x, y = w.inputs[keep][: count - seen], w.targets[keep][: count - seen]
            if len(x):
                yield Examples((x,), y, {"layer": torch.ones_like(x, dtype=torch.bool)})
            seen += len(x)
            if seen >= count:
                return

    @torch.no_grad()
    def score_test(self, beam: int, progress: bool) -> tuple[float, int, dict[str, float]]:
        """Test bits per byte (every target once, windows of the model's context)."""
        data = lm_data.stream(self.config, "test", lm_data.checkpoint_tokenizer(self.checkpoint))
        result = lm.evaluate(self.model, data, self.model.cfg.context, torch.device("cpu"), False, progress=progress)
        if result["bpb"] is None:
            raise ValueError(f"{self.path}: the test split's bytes are unknown (a .bin without a .bin.json "
                             "giving them); bits per byte cannot be computed")
        return result["bpb"], result["tokens"], {"loss": result["loss"]}


class LMTask(Task):
    name = "lm"
    help = "language modelling (decoder-only, any connection)"
    config = lm.LMTrainConfig
    trained = LMTrained
    metric, metric_label, higher_is_better = "test_bpb", "bits per byte", False
    curves, decimals = ("train_loss", "valid_loss"), 3  # bits per byte differ in the third decimal
    cost_columns = True
    compare_connections, compare_seeds, compare_out = ("PreLN", "PostLN", "2rSkip+LN", "SAS"), 2, "runs/compare-lm"
    depth_options, final_valid = ("layers",), ("final_valid_bpb", "final valid bits per byte")
    stall_margin = 0.5  # bits per byte: a run ending within 0.5 of the unigram model's level learned little
    probes = True

    def families(self) -> list[type]:
        return lm_families()

    def train(self, cfg: Any, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict[str, Any]:
        return lm.train(cfg, resume=resume, overwrite=overwrite, progress=progress)

    def score(self, cfg: Any, summary: dict[str, Any], progress: bool) -> dict[str, Any]:
        """Test loss and bits per byte of the final model, into the summary."""
        result = lm.evaluate_checkpoint(cfg.out, "test", data_dir=cfg.data_dir, device=cfg.device, progress=progress)
        summary = dict(summary, test_loss=result["loss"], test_bpb=result["bpb"], test_ppl=result["token_ppl"])
        run_dir.write_json(Path(cfg.out) / "summary.json", summary)
        return summary

    def reference(self, cfg: Any) -> dict[str, Any] | None:
        """The test bits per byte of the unigram model of the training split (:func:`lm_data.unigram_baseline`), in the
        run's tokens, computed once (a pass over the training split) and kept in the run's summary as
        ``unigram_test_bpb``, as :meth:`score` keeps the test score; None where the bytes are unknown (.bin files
        without their sidecar) or a subword run's tokenizer is (no checkpoint)."""
        path = Path(cfg.out) / "summary.json"
        summary = run_dir.read_json(path)
        if "unigram_test_bpb" not in summary:
            found = lm_data.unigram_baseline(cfg, "test")
            if found is None:  # not known now; a later sweep may find the checkpoint
                return None
            summary = dict(summary, unigram_test_bpb=found["bpb"])
            run_dir.write_json(path, summary)
        value = summary["unigram_test_bpb"]
        return None if value is None else {"label": "unigram model of the training split", "value": value}

    def probe_step(self, cfg: Any) -> tuple[Any, int]:
        """One update of ``cfg``'s model as ``train lm`` makes it (AdamW of the recipe, clipping), on
        ``batch_size`` random windows of its context; the vocabulary is its tokenizer's."""
        mcfg = cfg.model_config(lm_data.vocabulary(cfg))
        torch.manual_seed(cfg.seed)
        model = build_model(mcfg)
        param = parametrization.resolve(mcfg, cfg.parametrization)
        opt = torch.optim.AdamW(lm.parameter_groups(model, cfg.weight_decay, param, cfg.adam_eps), lr=cfg.lr,
                                betas=tuple(cfg.adam_betas), eps=cfg.adam_eps)
        parametrization.set_lr(opt, cfg.lr)
        tokens = torch.randint(0, mcfg.vocab_size, (cfg.batch_size, mcfg.context + 1),
                               generator=torch.Generator().manual_seed(0))
        x, y = tokens[:, :-1], tokens[:, 1:]

        def step() -> None:
            loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.clip_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
            opt.step()
            model.after_step()  # nGPT's renormalisation, as train lm

        return step, x.numel()

    def add_train_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--branch", default="", metavar="CHECKPOINT",
                       help="start --out from a step checkpoint of a --schedule wsd run's stable phase and decay it "
                            "to --max-steps (one run, several budgets); the other options are the checkpoint's")

    def before_train(self, args: argparse.Namespace) -> None:
        """``--branch CHECKPOINT``: the new run directory made from it, then trained as a resumed run. ``--decay``
        and ``--decay-shape`` given for a new run of another schedule than wsd: refused (they were recorded, and
        shaped nothing)."""
        unused = sorted({"decay", "decay_shape"} & config.given(args, lm.LMTrainConfig))
        if unused and not args.resume and not args.branch and args.schedule != "wsd":
            flags = " and ".join("--" + o.replace("_", "-") for o in unused)
            raise ValueError(f"{flags} shape the wsd schedule's decay; --schedule {args.schedule} has none "
                             "(give --schedule wsd, or leave them out)")
        if args.branch:
            if args.resume:
                raise ValueError("--branch makes a new run from a checkpoint; give it without --resume")
            given = config.given(args, lm.LMTrainConfig)
            other = sorted(given - {"max_steps", *lm_branch.BRANCH_MAY_SET}) + \
                sorted(given_family_options(args, self.families()))
            if other:
                flags = lambda names: ", ".join("--" + o.replace("_", "-") for o in names)  # noqa: E731
                raise ValueError(f"--branch trains on with the checkpoint's options: give --max-steps (and --out, "
                                 f"--overwrite, {flags(o for o in lm_branch.BRANCH_MAY_SET if o != 'out')}), "
                                 f"not {flags(other)}")
            # under torchrun rank 0 makes the directory, the others then read its config
            distributed.on_main_first("branch", lambda: lm_branch.branch(args.branch, args.out, args.overwrite,
                                                                         args.max_steps if "max_steps" in given else 0))
            args.resume, args.overwrite = True, False

    def shared_data(self, base: Any, root: Path, progress: bool = True) -> Any:
        """``base`` reading its text tokenised once (:func:`tokenised_once`) under ``root``; ``base`` itself where
        its data are a prepared folder or .bin files already."""
        if lm_data.prepared(base) is not None or base.binary:
            return base
        return dataclasses.replace(base, data_dir=str(tokenised_once(base, root, progress)))

    def check_scorable(self, cfg: Any) -> None:
        """The final model is scored on the test split: a prepared folder must have one (one line naming what it
        has), and text files need ``--test-file`` (with ``--corpus ''``)."""
        prep = lm_data.prepared(cfg)
        if prep is not None:
            prep.shards("test")  # each shard there, of the sidecar's type and count
        elif not cfg.corpus and not cfg.test_file:
            raise ValueError("the final model is scored on the test split: give --test-file (with --corpus '')")

    def data_name(self, cfg: Any) -> str:
        return cfg.corpus or Path(cfg.train_file).name

    def describe_data(self, cfg: Any) -> str:
        return f"{self.data_name(cfg)} ({cfg.tokenizer})"

    def cell_config(self, base: Any, run: Any, setting: Any) -> Any:
        """The setting's model with the cell's connection on every sub-layer and its model options (init=gpt2)."""
        options = dict(run.options)
        if run.connection:
            options["connection"] = connection(run.connection, 4).spec
        return dataclasses.replace(base, model=with_options(base.model, **options))

    def measure(self, cfg: Any, summary: dict[str, Any], metric: str, average: int, beam: int,
                progress: bool) -> dict[str, Any]:
        """The final model's test bits per byte or perplexity (per token), as ``metric`` says; scored once, into
        the run's summary (:meth:`score`)."""
        keys = {"bits per byte": "test_bpb", "perplexity": "test_ppl"}
        if metric not in keys:
            raise ValueError(f"a language-model cell measures {' or '.join(keys)}, not {metric!r}")
        if summary.get("test_bpb") is None and summary.get("test_ppl") is None:
            summary = self.score(cfg, summary, progress)
        return {"value": summary[keys[metric]], "test_loss": summary["test_loss"],
                "train_time_s": summary["train_time_s"]}

    def add_eval_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--checkpoint", required=True, help="a run directory (its last.pt) or a .pt file")
        p.add_argument("--split", default="test", choices=("valid", "test"), help="which split (default: test)")
        p.add_argument("--average", type=count(0), default=0,
                       help="average the run's last N step checkpoints (default: 0, off)")
        p.add_argument("--stride", type=count(0), default=0,
                       help="sliding windows: each scores its last N targets (default: 0, windows do not overlap)")
        p.add_argument("--data-dir", default="", help="where the corpus is, if not where the run found it")
        p.add_argument("--device", default="auto", help="cpu, cuda or auto (default: auto)")

    def evaluate(self, args: argparse.Namespace) -> dict[str, Any]:
        """Bits per byte, per-token and word perplexity of a language-model run on a split, with their counts."""
        return lm.evaluate_checkpoint(args.checkpoint, args.split, args.average, args.stride, args.data_dir,
                                      args.device)


def tokenised_once(cfg: lm.LMTrainConfig, root: Path, progress: bool = True) -> Path:
    """The folder of ``skiplab prepare lm`` holding ``cfg``'s text in ``cfg``'s tokens, under ``root/prepared/``,
    made the first time a comparison or sweep needs it and read by every run after: the text is tokenised (and a
    bpe / unigram tokenizer trained) once, not once a run. Its name is a digest of what decides the tokens: the
    corpus and where it is, or the files (path, size and modification time), the tokenizer spec (a pretrained
    one's file contents too) and a trained tokenizer's vocabulary size. Its runs' windows are those of the text
    (:func:`skiplab.corpora.prepare.prepare` writes :func:`skiplab.train.lm_data.stream`'s tokens)."""
    files = {s: getattr(cfg, f"{s}_file") for s in ("train", "valid", "test") if getattr(cfg, f"{s}_file")}
    stamp = {s: [str(Path(f).resolve()), *((Path(f).stat().st_size, Path(f).stat().st_mtime_ns)
                                           if Path(f).is_file() else ())] for s, f in files.items()}
    tokenizer = cfg.tokenizer
    contents = (hashlib.sha256(read_pretrained(tokenizer).to_bytes()).hexdigest()
                if tokenizer not in LM_TOKENIZERS else "")
    what = {"corpus": cfg.corpus, "data_dir": str(Path(cfg.data_dir).resolve()) if cfg.data_dir else "",
            "files": {} if cfg.corpus else stamp, "tokenizer": tokenizer, "tokenizer_sha256": contents,
            "vocab_size": cfg.vocab_size if tokenizer in ("bpe", "unigram") else None}
    digest = hashlib.sha1(json.dumps(what, sort_keys=True).encode()).hexdigest()[:8]
    name = "-".join(filter(None, (cfg.corpus or Path(cfg.train_file).stem, tokenizer.partition(":")[0], digest)))
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
    folder = Path(root) / "prepared" / name
    if not folder.is_dir():
        prepare(PrepareConfig(corpus=cfg.corpus, data_dir=cfg.data_dir, out=str(folder), tokenizer=tokenizer,
                              vocab_size=cfg.vocab_size,
                              **({} if cfg.corpus else {f"{s}_file": f for s, f in files.items()})), progress)
    read_prepared(folder)  # a folder left damaged is one line here, not in every run
    return folder


def add_generate_arguments(p: argparse.ArgumentParser) -> None:
    """``skiplab generate``'s options (:func:`sample_text`'s arguments)."""
    p.add_argument("--checkpoint", required=True, help="a run directory (its last.pt) or a .pt file")
    p.add_argument("--prompt", default="", help="the text to continue (default: none, a new document)")
    p.add_argument("--max-new-tokens", type=count(1), default=None,
                   help="tokens to add (default: 200, or as many as the model's context leaves after the prompt)")
    p.add_argument("--temperature", type=config.at_least(0.0), default=1.0,
                   help="softmax temperature; 0 is greedy (default: 1)")
    p.add_argument("--top-k", type=count(0), default=0, help="sample from the k likeliest (default: 0, all)")
    p.add_argument("--top-p", type=_nucleus, default=1.0, help="sample from the nucleus of mass p (default: 1, all)")
    p.add_argument("--seed", type=config.seed_value, default=0, help="seed of the sampling (default: 0)")
    p.add_argument("--average", type=count(0), default=0,
                   help="average the run's last N step checkpoints (default: 0, off)")


def _nucleus(text: str) -> float:
    """``--top-p``: a probability mass in (0, 1]."""
    p = config.finite(text)
    if not 0 < p <= 1:
        raise config.BadValue(f"must be in (0, 1], got {text}")
    return p


def sample_text(path: str, prompt: str, max_new: int | None = None, temperature: float = 1.0, top_k: int = 0,
                top_p: float = 1.0, seed: int = 0, average: int = 0) -> str:
    """``skiplab generate``: the text a trained run continues ``prompt`` with, ``max_new`` tokens at most (None: 200,
    or what the context leaves after the prompt). A prompt that leaves no room in the model's context is cut from
    its start, with a warning: the model reads its last tokens, as it would read them in a longer document."""
    _, model, tok = lm.load_run(path, average)
    if tok is None:
        raise ValueError(f"{path}: the run was trained on token files and holds no tokenizer to read a prompt with")
    ids = [tok.eot] + tok.encode(prompt)  # a document starts after an end of text, as in training
    context = model.cfg.context
    if max_new is None:
        max_new = max(1, min(200, context - len(ids)))
    if max_new >= context:
        raise ValueError(f"--max-new-tokens {max_new} leaves no room for a prompt in the model's context ({context})")
    if len(ids) + max_new > context:
        cut = len(ids) + max_new - context
        if cut > 1:  # the prompt's own tokens, not only the end of text before it (a document's start)
            warnings.warn(f"the prompt's first {cut - 1} of {len(ids) - 1} tokens cut: the model's context holds "
                          f"{context}, {max_new} of them for the new tokens", stacklevel=2)
        ids = ids[cut:]
    gen = torch.Generator().manual_seed(seed)
    new = generate(model, ids, max_new, tok.eot, temperature, top_k, top_p, gen, vocab=tok.vocab_size)
    return tok.decode(new)
