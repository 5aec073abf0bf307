"""fashion-mnist-scenes-crowded: a variant of :mod:`.scenes_hard` whose difficulty is in the pixels rather than in
the length of its captions: more, smaller and darker garments of fewer kinds a scene, and a where family that
names each garment by its kind and cell alone (the hard set's where captions, long and regular, carry its BLEU).

The canvas, grid and cells are the hard set's: a 64x64 grey canvas (uint8, background 0), a 3x3 grid of 21x21
cells (rows and columns 0-62; the last row and column stay 0), numbered 0-8 row by row (cell j: row j // 3, column
j % 3), named

    top left      top middle      top right
    middle left   centre          middle right
    bottom left   bottom middle   bottom right

A scene holds k garments, k uniform in {1, ..., 8}, in k distinct cells chosen uniformly (at least one cell stays
empty). Its kinds: M uniform in {2, 3}, m = min(k, M) distinct kinds drawn uniformly among the pool's classes; the
first m garments take one of them each, every other garment one of the m uniformly, so a scene of two or more
garments holds exactly two or three kinds (fewer only where the pool holds fewer classes), and a kind's look-alikes (its other garments) are its distractors.
Each kind's images come from the split's pool in a random order of their own (drawn once per split, kinds 0-9 in
turn), each garment taking its kind's next image; where a kind's images are used up its order begins again, so an
image is used twice in a split only then. The pools and splits are the easy set's (train from Fashion-MNIST's
training images but the last ``holdout``, val from those, test from t10k; 12,000 / 1,000 / 1,000 scenes by
default). Each garment has two drawn attributes, each uniform:

    size   small: resized to 10x10; large: resized to 20x20, by area averaging (each output pixel the mean of the
           input over its square, as OpenCV's INTER_AREA): out = A x A^T with A (s, 28),
           A[i, j] = (s / 28) * |[i 28/s, (i+1) 28/s) ∩ [j, j+1)|
    tone   dark: scaled so that its brightest pixel is 64; bright: so that it is 255:
           pixel = round(out * T / max(out)) (T = 64 or 255; an all-zero image stays 0)

pasted into its cell at an offset (dy, dx), each uniform in {0, ..., 21 - s}: pixel (r, c) of the garment at
(21 * row + dy + r, 21 * column + dx + c). Each split's generator is ``np.random.default_rng([seed, 20 +
{"train": 0, "val": 1, "test": 2}[split]])`` (other streams than the easy and hard sets'), drawn in a fixed order:
the k of every scene, the kinds' orders, then per scene its M, kinds and garments' kinds, cells, sizes, tones,
offsets and captions.

Five reference captions a scene, each from a different family, each true of the scene; all but where are the
hard set's (NUMBER now runs to eight; NP(c, n) and LIST are the easy set's, INVENTORY lists every kind with its
count; NP+, REF and REL are the hard set's: "a small dark coat", "the small coat", "above"):

    count      PREFIX INVENTORY                                         "there are three shirts and a bag"
    total      NUMBER[k] " item" | " items" ": " INVENTORY              "seven items: four shirts and three bags"
    where      LIST(NP(c, 1) " in the " CELL[g]) for min(k, 2) garments drawn at random, in cell order
                                                                        "a coat in the top left and a bag in the centre"
    attribute  size or tone at random; per value present, in the order small, large (dark, bright):
               VALUE ": " INVENTORY(the garments of that value), joined by "; "
                                                                        "small: two shirts and a bag; large: a shirt"
    relation   LIST(REF(a) " is " REL(a, b) " " REF(b)) for 1 or 2 pairs drawn among the garments that have a REF
                                                                        "the small dark shirt is above the large shirt"
    empty      INVENTORY ", with nothing in the " CELL (an empty cell drawn at random)
                                                                        "two coats and a bag, with nothing in the centre"

A scene of one garment gets count, total, where, attribute and empty; a scene of two or more, where two garments
have a REF, gets count, where, attribute, relation and one of total and empty; otherwise count, total, where,
attribute and empty; the five in random order. A where or relation caption keeps as many of its drawn parts, in
order, as fit in 30 words, at least one; every caption has at most 30 (the cpu setting's ``max_caption_len``). The
words are the hard set's and "seven", "eight".

What it asks beyond the hard set: up to eight garments of two or three kinds, so that counting is per kind among
many of it and a relation's garments are told apart by size and tone from their look-alikes; 10-pixel garments
and dark ones at 64 (a 10x10 dark sandal is a few dim pixels); counts to eight; a where caption that holds a kind
and a cell per garment and little template.
"""

from __future__ import annotations

import os

import numpy as np

from .scenes import HOLDOUT
from .scenes_hard import HardScenes, SceneRules, compose_hard_scenes, hard_scene_captions, rules_fashion_scenes

DATASET = "fashion-mnist-scenes-crowded"
CROWDED = SceneRules(DATASET, streams=(20, 21, 22), max_garments=8, sizes=(("small", 10), ("large", 20)),
                     tones=(("dark", 64), ("bright", 255)), where_garments=2, where_attributes=False,
                     scene_kinds=(2, 3))


def compose_crowded_scenes(images: np.ndarray, labels: np.ndarray, n: int, rng: np.random.Generator) -> HardScenes:
    """``n`` scenes from a pool of uint8 images (M, 28, 28) with labels 0-9 (M,); sources index the pool."""
    return compose_hard_scenes(images, labels, n, rng, CROWDED)


def crowded_fashion_scenes(fashion_dir: str | os.PathLike, split: str, n: int | None = None, seed: int = 0,
                           holdout: int = HOLDOUT) -> HardScenes:
    """The scenes of ``split`` (train, val, test; ``n`` of them, default :data:`~.scenes.SCENE_SPLITS`) from the
    Fashion-MNIST IDX files in ``fashion_dir``; sources index the split's IDX file."""
    return rules_fashion_scenes(CROWDED, fashion_dir, split, n, seed, holdout)


def crowded_scene_captions(garments: list[tuple[int, int, int, int]], rng: np.random.Generator) -> list[str]:
    """The five reference captions of a scene of ``garments``, (cell, label, size, tone) in cell order."""
    return hard_scene_captions(garments, rng, CROWDED)
