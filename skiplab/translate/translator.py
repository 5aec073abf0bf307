"""A trained run, ready to translate raw text: checkpoint (or the average of its last N), tokenizer, search."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from .. import run_dir
from ..device import pick_device
from ..models import EncoderDecoder, model_from_checkpoint
from ..corpora import load_split, make_batches
from ..tokenization import Tokenizer
from .metrics import BleuForms, bleu_forms, score_forms
from ..decoding import beam_search


ALPHA = 0.6  # the GNMT length penalty's exponent by default (Wu et al. 2016; the Transformer's)


@dataclass
class Translator:
    """A model in evaluation mode with its tokenizer and the run's config."""

    model: EncoderDecoder
    tok: Tokenizer
    config: dict[str, Any]
    checkpoint: dict[str, Any]
    device: torch.device

    @classmethod
    def load(cls, path: str | Path, average: int = 0, device: str = "auto") -> "Translator":
        ckpt = run_dir.average_checkpoints(path, average)[0] if average > 1 else run_dir.load_checkpoint(path, kind="mt")
        model = model_from_checkpoint(ckpt, path)
        mcfg = model.cfg
        try:
            tok = Tokenizer.from_bytes(ckpt["tokenizer"])
        except (KeyError, RuntimeError, ValueError) as err:
            raise run_dir.RunDirError(f"{path}: no usable tokenizer in the checkpoint ({err})") from None
        if tok.vocab_size != mcfg.vocab_size:
            raise run_dir.RunDirError(f"{path}: tokenizer has {tok.vocab_size} pieces, the model {mcfg.vocab_size}")
        dev = pick_device(device)
        return cls(model.to(dev).eval(), tok, ckpt["config"], ckpt, dev)

    @torch.no_grad()
    def translate(self, lines: list[str], beam: int = 4, alpha: float = ALPHA, max_tokens: int = 4096,
                  max_len_b: int = 50, progress: bool = False) -> list[str]:
        """Translations of ``lines``, in order (beam 1 is greedy search), the subwords joined back into text.

        The text is in the form the model was trained on: Moses-tokenised for a model trained on a
        tokenised corpus (WMT'14, IWSLT'15), whose ``lines`` should be Moses-tokenised too.

        The output is at most source + ``max_len_b`` tokens, and no more than the model's positions cover
        (``max_positions`` − 1, with the start token). A line longer than the encoder's positions take (with its
        end of sentence) is cut to that length, with a warning naming the line. An empty (or blank) line is given
        back empty, not decoded: from an end-of-sentence alone a model invents a sentence.
        """
        limit = self.model.cfg.max_positions - 1
        ids = self.tok.encode_batch(lines)
        for i, s in enumerate(ids):
            if len(s) > limit:
                warnings.warn(f"line {i + 1} has {len(s)} subword tokens, more than the {limit} this model takes "
                              f"(max_positions {self.model.cfg.max_positions}); translating its first {limit}",
                              stacklevel=2)
                ids[i] = s[:limit]
        out: list[str] = [""] * len(lines)
        longest = max((len(s) + 1 for s in ids), default=0)  # with EOS
        if longest > max_tokens:
            raise ValueError(f"--max-tokens {max_tokens} holds fewer tokens than the longest line's {longest} (with "
                             f"end of sentence); give --max-tokens {longest} or more")
        batches = make_batches(ids, None, max_tokens, indices=[i for i, line in enumerate(lines) if line.strip()])
        for b in tqdm(batches, desc="translate", unit="batch", disable=not progress):
            hyps = beam_search(self.model, b.src.to(self.device), beam=beam, alpha=alpha, max_len_b=max_len_b,
                               max_len=limit)
            for i, h in zip(b.index.tolist(), hyps):
                out[i] = self.tok.decode(h[0].tokens)
        return out

    def describe(self) -> dict[str, Any]:
        """The model, its connection (``{"encoder": ..., "decoder": ...}`` where the two stacks differ), the
        training run's seed, the checkpoint's step, and the model config."""
        cfg = self.model.cfg
        connection = getattr(cfg, "connection", None)
        if hasattr(cfg, "stack_connection"):
            stacks = {s: cfg.stack_connection(s) for s in ("encoder", "decoder")}
            connection = stacks["encoder"] if stacks["encoder"] == stacks["decoder"] else stacks
        return {"model": self.config["model"], **({"connection": connection} if connection else {}),
                "seed": self.config.get("seed"), "step": self.checkpoint["step"], "averaged": self.checkpoint.get("averaged"),
                "model_config": dataclasses.asdict(self.model.cfg)}


def split_forms(config: Mapping[str, Any], split: str, hyps: list[str], data_dir: str = "") -> BleuForms:
    """A split's references and the translations ``hyps`` of it in both BLEU forms (:func:`~.metrics.bleu_forms`).

    ``config`` is the run's training config (``Translator.config``, or ``"config"`` in its config.json),
    which names the corpus and the target language; ``data_dir`` overrides where the corpus is. ``hyps``
    are the model's outputs, e.g. the lines of the ``.hyp`` file :func:`evaluate_split` wrote. Two runs'
    forms on one split share the references, so a paired bootstrap takes ``forms_a.tok_refs``,
    ``forms_a.tok_hyps``, ``forms_b.tok_hyps`` with ``metric="bleu_tok"``, or the ``detok_`` lists with "bleu".
    """
    data = load_split({**config, **({"data_dir": data_dir} if data_dir else {})}, split)
    return bleu_forms(hyps, data.tgt, data.tokenized, config["tgt"])


def evaluate_split(path: str | Path, split: str = "test", average: int = 0, beam: int = 4, alpha: float = ALPHA,
                   data_dir: str = "", device: str = "auto", progress: bool = True) -> dict[str, Any]:
    """Translate a split of the run's corpus and score it in both forms (:func:`~.metrics.score_forms`).

    ``bleu`` (cased), ``bleu_lowercase`` and ``chrf`` are sacrebleu's on detokenised text: for a
    Moses-tokenised corpus (WMT'14, IWSLT'15) hypotheses and references go through the ``detokenizer``
    first. ``bleu_tok`` is tokenised case-sensitive BLEU as the papers report it (multi-bleu.perl style);
    for a raw corpus (Multi30k) both sides are Moses-tokenised for it. The model's translations are
    written beside the run, ``<run>/<split>.beam<k>[.alpha<a>][.avg<n>][.of-<checkpoint>].hyp``
    (:func:`~skiplab.run_dir.evaluation_stem`: a length penalty other than 0.6 and a checkpoint other than last.pt
    named), and, when detokenising changed them, the detokenised ones as ``....detok.hyp`` (``hypotheses_detok``; None
    otherwise); the report, with the machine and code version, as ``....json``.
    """
    tr = Translator.load(path, average, device)
    data = load_split({**tr.config, **({"data_dir": data_dir} if data_dir else {})}, split)
    hyps = tr.translate(data.src, beam=beam, alpha=alpha, progress=progress)
    forms = bleu_forms(hyps, data.tgt, data.tokenized, tr.config["tgt"])
    stem = run_dir.evaluation_stem(path, split, beam, average, f".alpha{alpha:g}" if alpha != ALPHA else "")
    hyp_file = stem.with_name(stem.name + ".hyp")
    hyp_file.write_text("".join(h + "\n" for h in hyps))
    detok_file = stem.with_name(stem.name + ".detok.hyp")
    if forms.detokenizer is not None and forms.detok_hyps != hyps:
        detok_file.write_text("".join(h + "\n" for h in forms.detok_hyps))
    else:
        detok_file.unlink(missing_ok=True)  # not one left from an earlier evaluation
        detok_file = None
    report = {**tr.describe(), "checkpoint": str(path), "split": data.name, "sentences": len(hyps), "beam": beam,
              "alpha": alpha, **score_forms(forms), "hypotheses": str(hyp_file),
              "hypotheses_detok": str(detok_file) if detok_file else None}
    run_dir.write_evaluation(stem, report)
    return report
