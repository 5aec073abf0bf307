"""The sizes of a harder composed set (fashion-mnist-scenes-hard, or --set fashion-mnist-scenes-crowded) beside
fashion-mnist-scenes (scene seed 0, the default splits) and a figure of its first test scenes with their five
references.

Per set and split: scenes, garments a scene and kinds a scene (histograms), words a caption (mean, max), how many
garments show an image the split has already pasted, the training captions' vocabulary; per split of the harder
set, how many captions each family gave. Writes OUT/stats.json and OUT/examples.png.

    OMP_NUM_THREADS=1 python experiments/caption_hard_stats.py --out docs/results/caption-hard
    OMP_NUM_THREADS=1 python experiments/caption_hard_stats.py --set fashion-mnist-scenes-crowded \
        --out docs/results/caption-crowded
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import Counter
from pathlib import Path

from skiplab.analysis.captions import draw_captions
from skiplab.data.scenes_hard import words
from skiplab.train.caption import SCENE_SETS, fashion_dir

EASY = "fashion-mnist-scenes"

# a caption's family from its shape (the grammar of skiplab.data.scenes_hard and scenes_crowded)
FAMILIES = (("total", lambda c: " item: " in c or " items: " in c), ("empty", lambda c: ", with nothing in the " in c),
            ("attribute", lambda c: c.split(":")[0] in ("small", "large", "dark", "bright")),
            ("relation", lambda c: c.startswith("the ")), ("where", lambda c: " in the " in c),
            ("count", lambda c: True))


def family(caption: str) -> str:
    return next(name for name, test in FAMILIES if test(caption))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for stats.json and examples.png")
    p.add_argument("--images", type=int, default=6, help="test scenes in the figure (default 6)")
    p.add_argument("--set", default="fashion-mnist-scenes-hard", choices=[n for n in SCENE_SETS if n != EASY],
                   help="the harder set measured beside the easy one (default fashion-mnist-scenes-hard)")
    args = p.parse_args()
    root = fashion_dir("")
    stats: dict = {"scene_seed": 0}
    hard_test = None
    for name in (EASY, args.set):
        compose, per = SCENE_SETS[name], {}
        for split in ("train", "val", "test"):
            s = compose(root, split)
            lengths = [words(c) for caps in s.captions for c in caps]
            per[split] = {"scenes": len(s), "garments_a_scene": dict(sorted(Counter(
                (s.cells[i] >= 0).sum().item() for i in range(len(s))).items())),
                "kinds_a_scene": dict(sorted(Counter(len(set(s.cells[i][s.cells[i] >= 0].tolist()))
                                                     for i in range(len(s))).items())),
                "words_a_caption_mean": statistics.fmean(lengths), "words_a_caption_max": max(lengths),
                "images_pasted_again": int((s.sources >= 0).sum()) - len(set(s.sources[s.sources >= 0].tolist()))}
            if name != EASY:
                per[split]["families"] = dict(Counter(family(c) for caps in s.captions for c in caps))
            if split == "train":
                vocab = Counter(w for caps in s.captions for c in caps for w in re.findall(r"[a-z0-9]+", c))
                per["vocabulary"] = len(vocab)
                per["vocabulary_seen_5_times"] = sum(n >= 5 for n in vocab.values())
            if name != EASY and split == "test":
                hard_test = s
        stats[name] = per
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    k = args.images
    refs = {f"reference {j + 1}": [hard_test.captions[i][j] for i in range(k)] for j in range(1, 5)}
    draw_captions([hard_test.pixels[i] for i in range(k)], [hard_test.captions[i][0] for i in range(k)], refs,
                  out / "examples.png", f"{args.set} test: the first {k} scenes, their five references")
    print(json.dumps(stats, indent=1))


if __name__ == "__main__":
    main()
