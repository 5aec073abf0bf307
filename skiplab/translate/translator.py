"""A trained run, ready to translate raw text: checkpoint (or the average of its last N), tokenizer, search."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from ..models import Transformer, build_model, model_config
from ..text import Tokenizer, make_batches
from ..train import run_dir
from ..train.device import pick_device
from ..train.recipe_mt import average_state_dicts
from .search import beam_search


def step_checkpoints(run: Path) -> list[Path]:
    """``checkpoint_<step>.pt`` files of a run directory, oldest first."""
    return sorted(run.glob("checkpoint_*.pt"), key=lambda p: int(p.stem.split("_")[-1]))


def average_checkpoints(run: str | Path, last: int) -> tuple[dict[str, Any], list[Path]]:
    """A checkpoint whose model is the mean of the last ``last`` step checkpoints of ``run``."""
    run = Path(run)
    files = step_checkpoints(run)[-last:] if run.is_dir() else []
    if len(files) < last:
        raise ValueError(f"{run}: {last} step checkpoints asked to average, {len(files)} found")
    states = [run_dir.load_checkpoint(f, kind="mt") for f in files]
    if any(s["model_config"] != states[-1]["model_config"] for s in states):
        raise ValueError(f"{run}: the checkpoints to average hold different models")
    return dict(states[-1], model=average_state_dicts([s["model"] for s in states]), averaged=[f.name for f in files]), files


@dataclass
class Translator:
    """A model in evaluation mode with its tokenizer and the run's config."""

    model: Transformer
    tok: Tokenizer
    config: dict[str, Any]
    checkpoint: dict[str, Any]
    device: torch.device

    @classmethod
    def load(cls, path: str | Path, average: int = 0, device: str = "auto") -> "Translator":
        ckpt = average_checkpoints(path, average)[0] if average > 1 else run_dir.load_checkpoint(path, kind="mt")
        try:
            mcfg = model_config(ckpt["config"]["model"], **ckpt["model_config"])
            model = build_model(mcfg)
            model.load_state_dict(ckpt["model"])
            tok = Tokenizer.from_bytes(ckpt["tokenizer"])
        except (TypeError, KeyError, RuntimeError, ValueError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise run_dir.RunDirError(f"{path}: checkpoint does not match the model it names ({first})") from None
        if tok.vocab_size != mcfg.vocab_size:
            raise run_dir.RunDirError(f"{path}: tokenizer has {tok.vocab_size} pieces, the model {mcfg.vocab_size}")
        dev = pick_device(device)
        return cls(model.to(dev).eval(), tok, ckpt["config"], ckpt, dev)

    @torch.no_grad()
    def translate(self, lines: list[str], beam: int = 4, alpha: float = 0.6, max_tokens: int = 4096,
                  max_len_b: int = 50, progress: bool = False) -> list[str]:
        """Detokenised translations of ``lines``, in order (beam 1 is greedy search)."""
        limit = self.model.cfg.max_positions - max_len_b - 1  # leave room for the output (source + 50)
        ids = [s[:limit] for s in self.tok.encode_batch(lines)]
        out: list[str] = [""] * len(lines)
        batches = make_batches(ids, None, max_tokens)
        for b in tqdm(batches, desc="translate", unit="batch", disable=not progress):
            hyps = beam_search(self.model, b.src.to(self.device), beam=beam, alpha=alpha, max_len_b=max_len_b)
            for i, h in zip(b.index.tolist(), hyps):
                out[i] = self.tok.decode(h[0].tokens)
        return out

    def describe(self) -> dict[str, Any]:
        return {"connection": self.config["connection"], "model": self.config["model"],
                "step": self.checkpoint["step"], "averaged": self.checkpoint.get("averaged"),
                "model_config": dataclasses.asdict(self.model.cfg)}


def evaluate_split(path: str | Path, split: str = "test", average: int = 0, beam: int = 4, alpha: float = 0.6,
                   data_dir: str = "", device: str = "auto", progress: bool = True) -> dict[str, Any]:
    """Translate a split of the run's corpus; BLEU (cased and lowercased) and chrF, with their signatures.

    The translations are written beside the run: ``<run>/<split>.beam<k>[.avg<n>].hyp``.
    """
    from ..train.mt import MTTrainConfig, load_split
    from .metrics import bleu, chrf

    tr = Translator.load(path, average, device)
    cfg = MTTrainConfig(**{**tr.config, "adam_betas": tuple(tr.config["adam_betas"]),
                           **({"data_dir": data_dir} if data_dir else {})})
    data = load_split(cfg, split)
    hyps = tr.translate(data.src, beam=beam, alpha=alpha, progress=progress)
    b, b_sig = bleu(hyps, data.tgt)
    b_lc, b_lc_sig = bleu(hyps, data.tgt, lowercase=True)
    c, c_sig = chrf(hyps, data.tgt)
    run = Path(path) if Path(path).is_dir() else Path(path).parent
    hyp_file = run / f"{split}.beam{beam}{f'.avg{average}' if average > 1 else ''}.hyp"
    hyp_file.write_text("".join(h + "\n" for h in hyps))
    return {**tr.describe(), "split": data.name, "sentences": len(hyps), "beam": beam, "alpha": alpha,
            "bleu": b, "bleu_signature": b_sig, "bleu_lowercase": b_lc, "bleu_lowercase_signature": b_lc_sig,
            "chrf": c, "chrf_signature": c_sig, "hypotheses": str(hyp_file)}
