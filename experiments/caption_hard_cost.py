"""What a 001-table5 cpu-scale run costs on fashion-mnist-scenes-hard (or --set fashion-mnist-scenes-crowded)
against fashion-mnist-scenes.

The cpu setting's PostLN captioner (captioner-small, batches of 50 (image, caption) pairs, captions cut at 30 words)
takes training steps on real batches of each set: each set's training split is composed, its vocabulary built and
its pairs shuffled as a run of seed 1 does; the steps alternate between the sets (one model per set, the same
initial weights but the output layer's size) so that the machine's load falls on both alike. Prints and writes
(--out, JSON) the median step time of each, their ratio, the composition time of the splits a run reads, and the
caption widths (words in a batch's longest caption), which with the image size set a step's cost.

    OMP_NUM_THREADS=1 python experiments/caption_hard_cost.py --steps 40 --out cost.json
    OMP_NUM_THREADS=1 python experiments/caption_hard_cost.py --set fashion-mnist-scenes-crowded --steps 10 \
        --out cost.json

The ratios are ``step_ratio_over_easy`` and ``run_ratio_over_easy_3000_steps`` (named ``..._hard_over_easy`` in
the hard set's recorded file, made before --set).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

from pathlib import Path

import torch

from skiplab.bench.steps import MTBatch, mt_step
from skiplab.models import build_model
from skiplab.reproduce.scales import CPU
from skiplab.data.captions import Vocabulary
from skiplab.train.caption import SCENE_SETS, encode_captions, load_split, pair_batches

EASY = "fashion-mnist-scenes"


def prepared(dataset: str, steps: int) -> dict:
    """The cpu setting's config on ``dataset``: its first ``steps`` shuffled training batches and a PostLN model."""
    base = CPU.settings["coco-caption"].config
    cfg = dataclasses.replace(base, dataset=dataset, model="captioner-small(connection=PostLN)", seed=1)
    t0 = time.perf_counter()
    splits = [load_split(cfg, s) for s in ("train", "valid", "test")]
    composed = time.perf_counter() - t0
    train = splits[0]
    vocab = Vocabulary.build((t for caps in train.tokens for t in caps), cfg.min_count)
    ids = encode_captions(vocab, train, cfg.max_caption_len)
    batches = pair_batches(train, ids, cfg.batch_size, True, torch.Generator().manual_seed(cfg.seed))[:steps]
    torch.manual_seed(0)
    model = build_model(cfg.model_config(len(vocab))).train()
    loaded = [b.to("cpu") for b in batches]
    return {"cfg": cfg, "composed_s": composed, "vocab": len(vocab), "model": model,
            "widths": [b.tgt_in.shape[1] - 1 for b in loaded],
            "steps": [mt_step(model, MTBatch(b.src, b.tgt_in, b.tgt_out)) for b in loaded]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="timed steps of each set (default 40)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps of each set first (default 3)")
    p.add_argument("--out", default="", help="also write the result here (JSON)")
    p.add_argument("--set", default="fashion-mnist-scenes-hard", choices=[n for n in SCENE_SETS if n != EASY],
                   help="the set timed against the easy one (default fashion-mnist-scenes-hard)")
    args = p.parse_args()
    sets = (EASY, args.set)
    runs = {d: prepared(d, args.warmup + args.steps) for d in sets}
    times: dict[str, list[float]] = {d: [] for d in sets}
    for k in range(args.warmup + args.steps):
        for d in sets:
            t0 = time.perf_counter()
            runs[d]["steps"][k]()
            if k >= args.warmup:
                times[d].append(time.perf_counter() - t0)
    easy, hard = (statistics.median(times[d]) for d in sets)
    result = {
        "set": args.set, "threads": torch.get_num_threads(), "steps": args.steps, "warmup": args.warmup,
        "per_set": {d: {"median_step_s": statistics.median(times[d]), "mean_step_s": statistics.fmean(times[d]),
                        "compose_splits_s": runs[d]["composed_s"], "vocabulary": runs[d]["vocab"],
                        "mean_width_words": statistics.fmean(runs[d]["widths"][args.warmup:])} for d in sets},
        "step_ratio_over_easy": hard / easy,
        "run_ratio_over_easy_3000_steps": (3000 * hard + runs[sets[1]]["composed_s"])
                                          / (3000 * easy + runs[sets[0]]["composed_s"]),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
