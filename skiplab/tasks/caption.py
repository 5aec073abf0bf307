"""Image captioning: the Transformer captioner (skiplab.models.captioner) trained with the translation recipe and
loop (skiplab.train.caption), decoded with beam search (skiplab.decoding) and scored with the COCO caption metrics
(skiplab.interop.coco_eval).

Blocks are the encoder and decoder layers, ``encoder.i`` / ``decoder.i`` (the analyses of a translation run take a
captioning run too); compare's metric is the test CIDEr (the toolkit's CIDEr-D, x 100 as papers print it) of the
average of the last (up to) 5 checkpoints with beam 3, higher is better; BLEU-4, METEOR (where Java runs) and
ROUGE-L go beside it in the summary. L_n is the sum of caption n's word cross-entropies.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from .. import run_dir
from ..analysis.captions import draw_captions
from ..analysis.trained import Examples
from ..config import count
from ..connections import connection
from ..decoding import beam_search
from ..device import pick_device
from ..interop import coco_eval
from ..models import caption_families, model_from_checkpoint, with_options
from ..data.captions import Vocabulary
from ..train import caption
from .base import Task, averaged_note
from .mt import MTTrained, add_decoding_arguments

PAD = Vocabulary.PAD
BEAM = 3  # compare's and score's beam (self-critical.pytorch's and the M² Transformer's evaluation beam)
AVERAGE = 5
# summary key -> the toolkit's metric, x 100 as captioning papers print them
SCORES = {"test_bleu4": "Bleu_4", "test_meteor": "METEOR", "test_rouge_l": "ROUGE_L", "test_cider": "CIDEr"}
# a table's metric columns -> the toolkit's names
METRICS = {"BLEU-1": "Bleu_1", "BLEU-2": "Bleu_2", "BLEU-3": "Bleu_3", "BLEU-4": "Bleu_4", "METEOR": "METEOR",
           "ROUGE-L": "ROUGE_L", "CIDEr": "CIDEr"}
COCO_FILES = ("Karpathy's split file dataset_coco.json and the bottom-up-attention region features of every image, "
              "one <cocoid>.npz (key 'feat', regions x 2048) in cocobu_att/, as self-critical.pytorch's "
              "scripts/make_bu_data.py writes them")


class CaptionTrained(MTTrained):
    """A captioning run as the analyses read it: a translation run's blocks, losses and units (caption words),
    with images for sources."""

    kind = "caption"
    splits = caption.SPLITS
    metric, metric_title, higher_is_better = "cider", "CIDEr", True

    def examples(self, split: str, count: int, seed: int = 0, batch: int = 50, max_tokens: int = 0,
                 data_dir: str = "", shuffle: bool = False) -> Iterator[Examples]:
        """(image, caption) pairs of ``count`` images of ``split`` (every caption of each), ``batch`` at a time."""
        self.check_split(split)
        where = {**self.config, **({"data_dir": data_dir} if data_dir else {})}
        data = caption.load_split(where, split)
        vocab = Vocabulary.from_bytes(self.checkpoint["tokenizer"])
        ids = caption.encode_captions(vocab, data, self.config["max_caption_len"])
        gen = torch.Generator().manual_seed(seed)
        keep = sorted(torch.randperm(len(data), generator=gen)[:count].tolist())
        picked = caption.Split(data.name, [data.ids[i] for i in keep], [data.raw[i] for i in keep],
                               [data.tokens[i] for i in keep], lambda k: data.load(keep[k]))  # noqa: B023
        for b in caption.pair_batches(picked, [ids[i] for i in keep], batch, shuffle, gen):
            b = b.to("cpu")
            encoder_mask = self.model.image_sequence(b.src)[1][:, 0, 0]  # (B, S): grid cells or real regions
            yield Examples((b.src, b.tgt_in), b.tgt_out, {"encoder": encoder_mask, "decoder": b.tgt_in != PAD})

    @torch.no_grad()
    def score_test(self, beam: int, progress: bool) -> tuple[float, int, dict[str, float]]:
        """Test CIDEr with beam search (the model as loaded, on its device), BLEU-4, METEOR and ROUGE-L beside it."""
        result = describe_split(self.model, Vocabulary.from_bytes(self.checkpoint["tokenizer"]), self.config,
                                "test", beam, progress)
        return result["CIDEr"], result["images"], {k: result[v] for k, v in SCORES.items() if k != "test_cider"}


def load_model(path: str | Path, average: int = 0, device: str = "auto") -> tuple[Any, Vocabulary, dict[str, Any]]:
    """A captioning run's model (the average of its last ``average`` step checkpoints where > 1) in evaluation mode,
    its vocabulary and its checkpoint."""
    ckpt = (run_dir.average_checkpoints(path, average, kind="caption")[0] if average > 1
            else run_dir.load_checkpoint(path, kind="caption"))
    model = model_from_checkpoint(ckpt, path)
    try:
        vocab = Vocabulary.from_bytes(ckpt["tokenizer"])
    except (KeyError, ValueError) as err:
        raise run_dir.RunDirError(f"{path}: no usable caption vocabulary in the checkpoint ({err})") from None
    if len(vocab) != model.cfg.vocab_size:
        raise run_dir.RunDirError(f"{path}: the vocabulary has {len(vocab)} words, the model {model.cfg.vocab_size}")
    return model.to(pick_device(device)).eval(), vocab, ckpt


@torch.no_grad()
def caption_images(model: Any, vocab: Vocabulary, arrays: list[Any], beam: int, limit: int) -> list[str]:
    """The best caption of each image (uint8 array, or features) by beam search (beam 1: greedy), at most ``limit``
    tokens with EOS: at most ``limit`` − 1 words, as training cut its captions (a hypothesis the search ended at
    the limit, with no EOS, keeps its first ``limit`` − 1)."""
    src = caption.stack_sources(arrays).to(next(model.parameters()).device)
    return [" ".join(vocab.tokens(h[0].tokens)[: limit - 1])
            for h in beam_search(model, src, beam=beam, max_len_a=0, max_len_b=limit)]


@torch.no_grad()
def describe_split(model: Any, vocab: Vocabulary, config: dict[str, Any], split: str, beam: int = BEAM,
                   progress: bool = False, batch: int = 50, max_len: int = 0,
                   data: caption.Split | None = None) -> dict[str, Any]:
    """Captions of every image of ``split`` (``data`` where it is already loaded) by beam search, scored against
    the split's references with the COCO metrics: {"captions": {image id: caption}, Bleu_1..4, METEOR, ROUGE_L,
    CIDEr (x 100; a metric that cannot run here is a string saying why), "images", "tokenizer"}."""
    data = data or caption.load_split(config, split)
    limit = max_len or config["max_caption_len"] + 1  # the words and EOS
    captions: dict[int, str] = {}
    for start in tqdm(range(0, len(data), batch), desc=f"caption {split}", unit="batch", disable=not progress):
        index = list(range(start, min(start + batch, len(data))))
        for i, text in zip(index, caption_images(model, vocab, [data.load(i) for i in index], beam, limit)):
            captions[data.ids[i]] = text
    refs = {data.ids[i]: data.raw[i] for i in range(len(data))}
    scores = coco_eval.score(refs, captions, metrics=("BLEU", "METEOR", "ROUGE_L", "CIDEr"))
    scaled = {k: (v * 100 if isinstance(v, float) else v) for k, v in scores.items() if k not in ("per_image",)}
    return {"split": data.name, "images": len(data), "beam": beam, **scaled, "captions": captions}


def evaluate_run(path: str | Path, split: str = "test", average: int = 0, beam: int = BEAM, data_dir: str = "",
                 device: str = "auto", progress: bool = True, figure: str | Path = "", figure_images: int = 6,
                 compare: tuple[str, ...] = ()) -> dict[str, Any]:
    """A run's captions of ``split`` and their scores; the captions are written beside the run as
    ``<split>.beam<k>[.avg<n>][.of-<checkpoint>].captions.json`` ({image id: caption}; a checkpoint other than the
    run's last.pt named: :func:`~skiplab.run_dir.evaluation_stem`) and the report, with the machine and code version,
    as ``....json``. With ``figure``, also a figure of the split's
    first ``figure_images`` images with a reference, this run's caption and those of the runs ``compare`` (decoded
    the same way), checked before anything is decoded."""
    model, vocab, ckpt = load_model(path, average, device)
    config = {**ckpt["config"], **({"data_dir": data_dir} if data_dir else {})}
    others = [load_model(other, average, device) for other in compare]
    data = caption.load_split(config, split)
    if figure and (not len(data) or data.load(0).dtype != np.uint8):
        raise ValueError(f"{path}: a caption figure needs images; this run reads region features")
    result = describe_split(model, vocab, config, split, beam, progress=progress, data=data)
    stem = run_dir.evaluation_stem(path, split, beam, average)
    out = stem.with_name(stem.name + ".captions.json")
    captions = result.pop("captions")
    run_dir.write_json(out, {str(k): v for k, v in captions.items()})
    report = {"model": ckpt["config"]["model"], "checkpoint": str(path), "step": ckpt["step"],
              "averaged": ckpt.get("averaged"), **result, "captions": str(out)}
    if figure:
        shown = list(range(min(figure_images, len(data))))
        images = [data.load(i) for i in shown]
        runs = [(str(path), model, vocab, ckpt), *[(str(p), *o) for p, o in zip(compare, others)]]
        labels = [run_label(m) for _, m, _, _ in runs]
        if len(set(labels)) < len(labels):  # seeds or runs of one design: name the runs too
            labels = [f"{label} ({p})" for label, (p, *_) in zip(labels, runs)]
        rows = {labels[0]: [captions[data.ids[i]] for i in shown]}
        for label, (_, m, v, c) in zip(labels[1:], runs[1:]):
            rows[label] = caption_images(m, v, images, beam, c["config"]["max_caption_len"] + 1)
        how = f"beam {beam}" + (f", the last {average} checkpoints averaged" if average > 1 else "")
        report["figure"] = str(draw_captions(images, [data.raw[i][0] for i in shown], rows, figure,
                                             f"{data.name}: the first {len(shown)} images, {how}"))
    run_dir.write_evaluation(stem, report)
    return report


def run_label(model: Any) -> str:
    """A captioner's connection, as a legend names it: one spec, or the encoder's and the decoder's."""
    enc, dec = model.cfg.stack_connection("encoder"), model.cfg.stack_connection("decoder")
    return enc if enc == dec else f"{enc} / {dec}"


class CaptionTask(Task):
    name = "caption"
    help = "image captioning (Transformer captioner, the translation recipe)"
    config = caption.CaptionTrainConfig
    trained = CaptionTrained
    metric, metric_label, higher_is_better = "test_cider", "CIDEr", True
    curves = ("train_loss", "valid_loss")
    cost_columns = True
    compare_connections, compare_seeds, compare_out = ("PostLN", "SAS", "2rSkip+LN"), 3, "runs/compare-caption"

    def families(self) -> list[type]:
        return caption_families()

    def train(self, cfg: Any, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict[str, Any]:
        return caption.train(cfg, resume=resume, overwrite=overwrite, progress=progress)

    def score(self, cfg: Any, summary: dict[str, Any], progress: bool) -> dict[str, Any]:
        """Score the test split with the average of the last (up to) 5 checkpoints, beam 3, into the summary."""
        average = min(AVERAGE, len(run_dir.step_checkpoints(Path(cfg.out))))
        result = evaluate_run(cfg.out, "test", average=average, beam=BEAM, device=cfg.device, progress=progress)
        summary = dict(summary, **{k: result[v] for k, v in SCORES.items()}, averaged=average,
                       caption_tokenizer=result["tokenizer"])
        run_dir.write_json(Path(cfg.out) / "summary.json", summary)
        return summary

    def metric_note(self, runs: list[tuple[str, int, dict[str, Any]]]) -> str:
        return averaged_note("test CIDEr", runs, AVERAGE, BEAM)

    def check_scorable(self, cfg: Any) -> None:
        """compare's and sweep's metric, the test CIDEr, needs pycocoevalcap: refused before anything trains."""
        why = coco_eval.unavailable("CIDEr")
        if why:
            raise ValueError(f"captioning runs are compared by their test CIDEr, which cannot be computed here: {why}")

    def data_name(self, cfg: Any) -> str:
        """The folder of ``reproduce --data-root`` the data are in: fashion-mnist (the scenes' images) or coco."""
        return "fashion-mnist" if cfg.dataset else "coco"

    def describe_data(self, cfg: Any) -> str:
        return cfg.dataset or Path(cfg.captions).name

    def run_label(self, cfg: Any) -> tuple[str, ...]:
        """The data folder and model; a composed set other than the default one by its own name (the default set's
        runs keep the names they were recorded under)."""
        default = caption.CaptionTrainConfig.dataset
        return (cfg.dataset if cfg.dataset not in ("", default) else self.data_name(cfg), cfg.model)

    def with_dataset(self, cfg: Any, name: str) -> Any:
        """A composed setting's config on the composed set ``name`` (the cpu and smoke settings'); a setting that
        reads COCO files has no such choice."""
        if name not in caption.SCENE_SETS:
            raise ValueError(f"unknown captioning dataset {name!r} for --dataset; known: {', '.join(caption.SCENE_SETS)}")
        if not cfg.dataset:
            return f"this setting reads COCO files ({Path(cfg.captions).name}), not a composed set"
        return dataclasses.replace(cfg, dataset=name)

    def missing_data(self, cfg: Any) -> str:
        """Caption files named by ``cfg`` that are not there (the composed set is made from Fashion-MNIST, which
        the run finds or names itself)."""
        if cfg.dataset:
            return ""
        c = dataclasses.asdict(cfg)
        wanted = [k for k in ("captions", "valid_captions", "test_captions", "image_dir", "feature_dir") if c[k]]
        absent = [caption.data_path(c, k) for k in wanted if not Path(caption.data_path(c, k)).exists()]
        if not absent:
            return ""
        return (f"needs {', '.join(absent)} ({'--data-root holding coco/' if not cfg.data_dir else 'absent'}): "
                f"{COCO_FILES}")

    def cell_config(self, base: Any, run: Any, setting: Any) -> Any:
        """The setting's captioner with the row's connection on every sub-layer of both stacks."""
        return dataclasses.replace(base, model=with_options(base.model, connection=connection(run.connection, 4).spec))

    def measure(self, cfg: Any, summary: dict[str, Any], metric: str, average: int, beam: int,
                progress: bool) -> dict[str, Any]:
        """The cell's metric (BLEU-1..4, METEOR, ROUGE-L, CIDEr; x 100) of the test captions of the average of the
        last ``average`` checkpoints; one evaluation per run, cached in its directory."""
        if metric not in METRICS:
            raise ValueError(f"a captioning cell measures one of {', '.join(METRICS)}, not {metric!r}")
        out = Path(cfg.out)
        average = run_dir.averaged_over(out, average, lambda n: out / f"score.test.beam{beam}.avg{n}.json")
        cache = out / f"score.test.beam{beam}.avg{average}.json"
        if cache.is_file():
            score = run_dir.read_json(cache)
        else:
            score = evaluate_run(out, "test", average, beam, cfg.data_dir, cfg.device, progress)
            run_dir.write_json(cache, score)
        value = score[METRICS[metric]]
        return {"value": value if isinstance(value, float) else None, "train_time_s": summary["train_time_s"],
                **({"why": value} if isinstance(value, str) else {})}

    def add_eval_arguments(self, p: argparse.ArgumentParser) -> None:
        add_decoding_arguments(p, beam=BEAM, alpha=False)
        p.add_argument("--split", default="test", choices=("valid", "test"), help="which split (default: test)")
        p.add_argument("--data-dir", default="", help="where the data are, if not where the run found them")
        p.add_argument("--figure", default="", metavar="FILE",
                       help="also draw the split's first images with a reference and the captions (default: none)")
        p.add_argument("--figure-images", type=count(1), default=6, help="images in --figure (default: 6)")
        p.add_argument("--compare", nargs="+", default=[], metavar="RUN",
                       help="more runs whose captions go beside this run's in --figure")
        p.add_argument("--overwrite", action="store_true", help="replace --figure if it exists")

    def evaluate(self, args: argparse.Namespace) -> dict[str, Any]:
        """BLEU-1..4, METEOR, ROUGE-L and CIDEr of a captioning run on a split; the captions written beside it."""
        if args.compare and not args.figure:
            raise ValueError("--compare puts other runs' captions in --figure; give --figure FILE")
        runs = [str(Path(r).resolve()) for r in [args.checkpoint, *args.compare]]
        if len(set(runs)) < len(runs):
            raise ValueError("a run is named more than once in --checkpoint and --compare")
        if args.figure and Path(args.figure).exists() and not args.overwrite:
            raise run_dir.RunDirError(f"{args.figure} exists; use --overwrite to replace it")
        return evaluate_run(args.checkpoint, args.split, args.average, args.beam, args.data_dir, args.device,
                            figure=args.figure, figure_images=args.figure_images, compare=tuple(args.compare))
