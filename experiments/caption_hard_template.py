"""How much of a caption run's test BLEU its template carries on fashion-mnist-scenes-hard (or --set
fashion-mnist-scenes-crowded, whose words are the same but "seven" and "eight"): the run's captions scored as they
are, and again with every kind, cell, size and tone word drawn at random (the caption's form kept, what it says of
the scene lost), against the same references; with --families, also how many of the decoded captions each family
gives (by shape, :func:`decoded_family`) and their mean length in words.

    python experiments/caption_hard_template.py RUN/test.beam3.avg5.captions.json --out template.json
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
from collections import Counter
from pathlib import Path

from skiplab.data.scenes import CLASS_WORDS
from skiplab.data.scenes_hard import CELL_NAMES, SIZES, TONES, words
from skiplab.interop.coco_eval import score
from skiplab.train.caption import SCENE_SETS, fashion_dir

KEEP = ("Bleu_1", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr")


def scrambled(caption: str, rng: random.Random) -> str:
    """``caption`` with each kind, cell, size and tone word replaced by one of its class drawn at random."""
    groups = [[w for pair in CLASS_WORDS for w in pair], list(CELL_NAMES), [w for w, _ in SIZES], [w for w, _ in TONES]]
    words = sorted({w for g in groups for w in g}, key=len, reverse=True)
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, words)) + r")\b")

    def pick(m: re.Match) -> str:
        group = next(g for g in groups if m[1] in g)
        if m[1] in (w for pair in CLASS_WORDS for w in pair):  # keep the number of a kind
            index = [w for pair in CLASS_WORDS for w in pair].index(m[1]) % 2
            return rng.choice(CLASS_WORDS)[index]
        return rng.choice(group)

    return pattern.sub(pick, caption)


NUMBER_ITEMS = re.compile(r"(one|two|three|four|five|six|seven|eight) items? ")


def decoded_family(caption: str) -> str:
    """A decoded caption's family from its shape; decoded captions are words without punctuation ("one item a
    bag"), so the references' colons and commas cannot tell them apart as in experiments/caption_hard_stats.py."""
    if NUMBER_ITEMS.match(caption):
        return "total"
    if " with nothing in the " in caption:
        return "empty"
    if caption.split(" ")[0] in ("small", "large", "dark", "bright"):
        return "attribute"
    if caption.startswith("the "):
        return "relation"
    return "where" if " in the " in caption else "count"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("captions", help="a run's test captions file ({image id: caption})")
    p.add_argument("--out", default="", help="also write the scores here (JSON)")
    p.add_argument("--set", default="fashion-mnist-scenes-hard",
                   choices=("fashion-mnist-scenes-hard", "fashion-mnist-scenes-crowded"),
                   help="the set whose test references score the captions (default fashion-mnist-scenes-hard)")
    p.add_argument("--families", action="store_true", help="also count the decoded captions' families")
    args = p.parse_args()
    captions = {int(k): v for k, v in json.load(open(args.captions)).items()}
    test = SCENE_SETS[args.set](fashion_dir(""), "test")
    refs = {i: test.captions[i] for i in captions}
    rng = random.Random(0)
    result = {"as_decoded": {k: score(refs, captions)[k] for k in KEEP},
              "words_drawn_at_random": {k: score(refs, {i: scrambled(c, rng) for i, c in captions.items()})[k]
                                        for k in KEEP}}
    if args.families:
        result["families_as_decoded"] = dict(Counter(decoded_family(c) for c in captions.values()).most_common())
        result["words_as_decoded_mean"] = statistics.fmean(words(c) for c in captions.values())
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
