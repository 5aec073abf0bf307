"""Machine translation: encoder-decoder families (Transformer with any connection, the depth-wise LSTM), the
Transformer recipe (skiplab.train.mt), beam search and BLEU (skiplab.translate).

Blocks are the encoder and decoder layers, ``encoder.i`` / ``decoder.i``; compare's metric is the test
BLEU of the average of the last (up to) 5 checkpoints with beam 4, higher is better; L_n is the sum of
sentence n's target tokens' cross-entropies.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import run_dir
from ..analysis.trained import Examples, Trained
from ..config import at_least, count
from ..connections import connection
from ..models import format_model_spec, model_config, parse_model_spec, seq2seq_families
from ..corpora import encode_parallel, filter_long, load_split, make_batches
from ..tokenization import Tokenizer
from ..train import mt
from ..translate.metrics import bleu_forms, paired_bootstrap, score_forms
from ..translate.translator import ALPHA, Translator, evaluate_split, split_forms
from .base import Task, averaged_note

PAD = Tokenizer.PAD


AVERAGE, BEAM = 5, 4  # compare's test score: the last 5 checkpoints averaged, beam 4 (Vaswani et al. 2017)


class MTTrained(Trained):
    kind = "mt"
    splits = ("train", "valid", "test")
    stacks = {"encoder": "encoder.layers", "decoder": "decoder.layers"}
    metric, metric_title, higher_is_better = "bleu", "BLEU", True

    def losses(self, ex: Examples, output: Tensor) -> Tensor:
        nll = F.cross_entropy(output.float().transpose(1, 2), ex.target, ignore_index=PAD, reduction="none")
        return nll.sum(1)

    def units(self, ex: Examples) -> Tensor:
        """Real target tokens: training normalises per target token."""
        return (ex.target != PAD).sum()

    def examples(self, split: str, count: int, seed: int = 0, batch: int = 250, max_tokens: int = 4096,
                 data_dir: str = "", shuffle: bool = False) -> Iterator[Examples]:
        """Sentence pairs in batches of up to ``max_tokens``: length-sorted, in random order with ``shuffle``."""
        self.check_split(split)
        gen = torch.Generator().manual_seed(seed)
        where = {**self.config, **({"data_dir": data_dir} if data_dir else {})}
        tok = Tokenizer.from_bytes(self.checkpoint["tokenizer"])
        src, tgt = encode_parallel(tok, load_split(where, split))
        kept, _ = filter_long(src, tgt, min(self.config["max_len"], self.model.cfg.max_positions))
        pick = torch.tensor(kept)[torch.randperm(len(kept), generator=gen)[:count]].sort().values.tolist()
        for b in make_batches(src, tgt, max_tokens, pick, shuffle=shuffle, generator=gen):
            yield Examples((b.src, b.tgt_in), b.tgt_out, {"encoder": b.src != PAD, "decoder": b.tgt_in != PAD})

    @torch.no_grad()
    def score_test(self, beam: int, progress: bool) -> tuple[float, int, dict[str, float]]:
        """Test BLEU (beam search, the run's tokenizer; sacrebleu on detokenised text), and tokenised BLEU as
        the papers report it (skiplab.translate.metrics) as ``bleu_tok``."""
        test = load_split(self.config, "test")
        translator = Translator(self.model, Tokenizer.from_bytes(self.checkpoint["tokenizer"]), self.config,
                                self.checkpoint, torch.device("cpu"))
        hyps = translator.translate(test.src, beam=beam, progress=progress)
        scores = score_forms(bleu_forms(hyps, test.tgt, test.tokenized, self.config["tgt"]))
        return scores["bleu"], len(hyps), {"bleu_tok": scores["bleu_tok"]}


def add_decoding_arguments(p: argparse.ArgumentParser, beam: int = 4, alpha: bool = True) -> None:
    """The options of every command that decodes with a trained encoder-decoder run (translation, captioning):
    ``beam`` the default beam, ``alpha`` whether the GNMT length penalty is an option."""
    p.add_argument("--checkpoint", required=True, help="a run directory (its last.pt) or a .pt file")
    p.add_argument("--average", type=count(0), default=0,
                   help="average the run's last N step checkpoints (default: 0, off)")
    p.add_argument("--beam", type=count(1), default=beam, help=f"beam size; 1 is greedy search (default: {beam})")
    if alpha:
        p.add_argument("--alpha", type=at_least(0), default=ALPHA,
                       help=f"GNMT length penalty ((5+|y|)/6)^alpha (default: {ALPHA:g})")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default: auto)")


class MTTask(Task):
    name = "mt"
    help = "machine translation (Transformer recipe)"
    config = mt.MTTrainConfig
    trained = MTTrained
    metric, metric_label, higher_is_better = "test_bleu", "BLEU", True
    curves = ("train_loss", "valid_loss")
    cost_columns = True
    compare_connections, compare_seeds, compare_out = ("PostLN", "2xSkip+LN", "2rSkip+LN"), 2, "runs/compare-mt"
    significance, paired = "paired bootstrap per seed (1,000 resamples, tokenised BLEU)", True

    def families(self) -> list[type]:
        return seq2seq_families()

    def train(self, cfg: Any, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict[str, Any]:
        return mt.train(cfg, resume=resume, overwrite=overwrite, progress=progress)

    def score(self, cfg: Any, summary: dict[str, Any], progress: bool) -> dict[str, Any]:
        """Score the test set with the average of the last (up to) 5 checkpoints, beam 4, into the summary."""
        average = min(AVERAGE, len(run_dir.step_checkpoints(Path(cfg.out))))
        result = evaluate_split(cfg.out, "test", average=average, beam=BEAM, progress=progress)
        summary = dict(summary, test_bleu=result["bleu"], test_chrf=result["chrf"],
                       bleu_signature=result["bleu_signature"], averaged=average)
        run_dir.write_json(Path(cfg.out) / "summary.json", summary)
        return summary

    def metric_note(self, runs: list[tuple[str, int, dict[str, Any]]]) -> str:
        return averaged_note("test BLEU", runs, AVERAGE, BEAM)

    def data_name(self, cfg: Any) -> str:
        return cfg.corpus

    def describe_data(self, cfg: Any) -> str:
        return f"{cfg.corpus or 'files'} {cfg.src}-{cfg.tgt}"

    def add_eval_arguments(self, p: argparse.ArgumentParser) -> None:
        add_decoding_arguments(p)
        p.add_argument("--split", default="test", choices=("valid", "test"), help="which split (default: test)")
        p.add_argument("--data-dir", default="", help="where the corpus is, if not where the run found it")

    def evaluate(self, args: argparse.Namespace) -> dict[str, Any]:
        """BLEU and chrF (sacrebleu) of a translation run on a split, with signatures."""
        return evaluate_split(args.checkpoint, args.split, args.average, args.beam, args.alpha, args.data_dir,
                              args.device)

    def cell_config(self, base: Any, run: Any, setting: Any) -> Any:
        """The cell's family at the setting's size, with its options, connection and layer count."""
        name, options = parse_model_spec(f"{run.family}-{setting.size}")
        options = {**options, **dict(run.options)}
        if run.family == "transformer" and run.connection:
            options["connection"] = connection(run.connection, 4).spec
        preset = model_config(format_model_spec(name, options), vocab_size=100)
        layers = preset.encoder_layers
        if run.layers:
            if run.layers not in setting.layers:
                return f"no {run.layers}-layer model there"
            layers = setting.layers[run.layers]
            if layers != preset.encoder_layers or layers != preset.decoder_layers:
                options.update(encoder_layers=layers, decoder_layers=layers)
        if run.probe and run.probe[1] > layers:
            return f"the model there has {layers} layers"
        return dataclasses.replace(base, model=format_model_spec(name, options))

    def measure(self, cfg: Any, summary: dict[str, Any], metric: str, average: int, beam: int,
                progress: bool) -> dict[str, Any]:
        """Tokenised test BLEU (the papers' form) of the average of the last ``average`` checkpoints, with
        sacrebleu's beside it; cached in the run directory."""
        score = _test_score(cfg, average, beam, progress)
        return {"value": score["bleu_tok"], "bleu_detok": score["bleu"], "bleu_tok_signature": score["bleu_tok_signature"],
                "bleu_signature": score["bleu_signature"], "averaged": score.get("averaged") or average,
                "hypotheses": score["hypotheses"], "train_time_s": summary["train_time_s"]}

    def paired_p(self, a: dict[str, Any], b: dict[str, Any], cfg_a: Any, cfg_b: Any) -> float | None:
        """p of the paired bootstrap (1,000 resamples, tokenised BLEU) between two seed-matched test outputs."""
        if not (a and b and a.get("hypotheses") and b.get("hypotheses")):
            return None
        hyps_a = _hypotheses(a, cfg_a).read_text().splitlines()
        hyps_b = _hypotheses(b, cfg_b).read_text().splitlines()
        fa = split_forms(dataclasses.asdict(cfg_a), "test", hyps_a, cfg_a.data_dir)
        fb = split_forms(dataclasses.asdict(cfg_b), "test", hyps_b, cfg_b.data_dir)
        return paired_bootstrap(fa.tok_refs, fa.tok_hyps, fb.tok_hyps, metric="bleu_tok")["p_value"]


def _hypotheses(score: dict[str, Any], cfg: Any) -> Path:
    """The test translations a cached score names: where they were written, or beside the run where it has
    moved since (a run collected into the repository)."""
    path = Path(score["hypotheses"])
    return path if path.is_file() else Path(cfg.out) / path.name


def _test_score(cfg: Any, average: int, beam: int, progress: bool) -> dict[str, Any]:
    """The test scores of a finished run, averaged over its last ``average`` checkpoints (cached)."""
    out = Path(cfg.out)
    average = run_dir.averaged_over(out, average, lambda n: out / f"score.test.beam{beam}.avg{n}.json")
    cache = out / f"score.test.beam{beam}.avg{average}.json"
    if cache.is_file():
        return run_dir.read_json(cache)
    result = evaluate_split(out, "test", average=average, beam=beam, data_dir=cfg.data_dir, device=cfg.device,
                            progress=progress)
    result = {k: v for k, v in result.items() if k != "model_config"}
    run_dir.write_json(cache, result)
    return result
