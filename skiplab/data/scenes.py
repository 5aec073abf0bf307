"""fashion-mnist-scenes: an image-captioning set of real images, composed deterministically from Fashion-MNIST,
saved in the COCO caption formats (a stand-in for MSCOCO with Karpathy's splits, small enough to train on).

A scene is a 64x64 grey canvas (uint8, background 0) cut into a 2x2 grid of 32x32 cells, numbered 0 top left,
1 top right, 2 bottom left, 3 bottom right (cell j: row j // 2, column j % 2). It holds k garments, k uniform
in {1, 2, 3}, in k distinct cells chosen uniformly; a garment is one 28x28 Fashion-MNIST image pasted centred
in its cell, its pixel (r, c) at (32 * row + 2 + r, 32 * column + 2 + c) (the 2-pixel border of
:mod:`.idx`); all else is 0. Images are drawn without replacement from the split's pool (none used twice
in a split), so a kind's count follows Fashion-MNIST's (balanced) labels:

    train   Fashion-MNIST's training images but the last ``holdout`` (default 5000)    default 12000 scenes
    val     the last ``holdout`` training images                                          default  1000 scenes
    test    the t10k images                                                               default  1000 scenes

The split names are Karpathy's ("val", not "valid"). Each split draws from its own generator,
``np.random.default_rng([seed, {"train": 0, "val": 1, "test": 2}[split]])``, in a fixed order (the k of every
scene, then the pool's order, then per scene its cells and its captions), so a call gives the same scenes
byte for byte whatever the other splits' sizes.

Five reference captions a scene, each from a different family of this grammar, each true of the scene
(a phrase naming one garment says that some garment of that kind stands there):

    NP(c, 1)   "a " | "an " SINGULAR[c]        "a bag", "an ankle boot", "a pair of trousers"
    NP(c, n)   NUMBER[n] " " PLURAL[c]         "two bags", "three pairs of trousers"          (n = 2, 3)
    LIST(x)    x1 | x1 " and " x2 | x1 ", " x2 " and " x3
    INVENTORY  LIST(NP(c, n_c) for every kind c in the scene, n_c its count), kinds in random order
    CELL       "top left" | "top right" | "bottom left" | "bottom right"
    SIDE       "at the top" | "at the bottom" (the garment's row) | "on the left" | "on the right" (its column)
    REL        "to the left of" | "to the right of" (same row) | "above" | "below" (same column)
               | "diagonally across from" (neither)

    count      PREFIX INVENTORY            PREFIX: "", "there is " / "there are " (by the first NP), "a picture
                                           of ", "an image of "                 "there are two bags and a coat"
    total      NUMBER[k] " item" | " items" ": " INVENTORY                      "three items: two bags and a coat"
    where      LIST(NP(c, 1) " in the " CELL " corner" for every garment, random order)
                                           "a coat in the top left corner and a bag in the bottom right corner"
    side       LIST(NP(c, 1) " " SIDE for 1 or 2 garments, each its row or its column at random)
                                           "a coat on the left and a bag at the bottom"
    relation   LIST(NP(a, 1) " " REL " " NP(b, 1) for 1 or 2 pairs of garments, each pair either way round)
                                           "a bag to the left of a coat"; only a pair sharing a row or a column,
                                           "diagonally across from" where a scene has no such pair (k = 2)
    empty      INVENTORY ", with nothing in the " CELL " corner"   "a dress, with nothing in the top left corner"

A one-garment scene gets count, total, where, side and empty; a scene of two or three gets count, where and
relation and two of total, side and empty; the five in random order. SINGULAR / PLURAL (:data:`CLASS_WORDS`):
tee shirt(s), pair(s) of trousers, pullover(s), dress(es), coat(s), sandal(s), shirt(s), sneaker(s), bag(s),
ankle boot(s), for the labels 0-9 (T-shirt/top, Trouser, ..., Ankle boot); NUMBER: one, two, three. No word has
a hyphen ("tee shirt", not "t-shirt"), so Karpathy's tokenisation (which makes "t-shirt" "t shirt") and the COCO
evaluation toolkit's PTB tokenizer (which keeps "t-shirt" whole) agree on every caption: a model trained on the
tokens is scored against references tokenised the same way. The captions use 52 words.

What a model must learn to caption a scene: to recognise the ten kinds from real, varied pixels (shirt,
tee shirt, pullover and coat are the kinds Fashion-MNIST classifiers confuse); to count them, per kind and in
all (one to three); to locate each garment in the grid (which corner, which side); and the relations
between two garments (left of, above, diagonally across), which need both garments' kinds and positions at
once. No caption can be written without the pixels: kinds, counts, cells and relations are all drawn.

On disk (:func:`skiplab.data.scene_files.write_scenes`), the formats of MSCOCO and Karpathy's split file (:mod:`skiplab.data.captions`
reads them):

    images/<split>_<index:06d>.png     the scenes, 8-bit grey PNG
    captions_<split>.json              COCO captions: {"info", "licenses", "images": [{"id", "file_name",
                                       "height", "width"}], "annotations": [{"id", "image_id", "caption"}]};
                                       file_name relative to images/
    dataset.json                       Karpathy's: {"dataset": "fashion-mnist-scenes", "images": [{"filepath":
                                       "images", "filename", "imgid", "split", "sentences": [{"tokens", "raw",
                                       "imgid", "sentid"}], "sentids", "cocoid"}]}; imgid and sentid count from
                                       0 over all splits (train, val, test), the COCO ids are imgid + 1 and
                                       sentid + 1
    scenes.json                        the scenes' contents: {"cells", "classes", "images": [{"id", "split",
                                       "file_name", "cells": [4 labels, -1 where empty], "sources": [4 indices
                                       into the IDX file (train for train and val, t10k for test), -1 where
                                       empty]}]}
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import idx

DATASET = "fashion-mnist-scenes"
CLASS_WORDS = (  # (singular, plural) for Fashion-MNIST labels 0-9
    ("tee shirt", "tee shirts"), ("pair of trousers", "pairs of trousers"), ("pullover", "pullovers"),
    ("dress", "dresses"), ("coat", "coats"), ("sandal", "sandals"), ("shirt", "shirts"), ("sneaker", "sneakers"),
    ("bag", "bags"), ("ankle boot", "ankle boots"),
)
CELL_NAMES = ("top left", "top right", "bottom left", "bottom right")
# the easy set uses one to three, the hard set to six, the crowded set to eight
NUMBERS = ("none", "one", "two", "three", "four", "five", "six", "seven", "eight")
SCENE_SPLITS = {"train": 12000, "val": 1000, "test": 1000}
HOLDOUT = 5000  # training images kept for val
CANVAS, CELL, PAD = 64, 32, 2  # 2 x 32 = 64; 28 + 2 x 2 = 32
CAPTIONS = 5
_SPLIT_SEEDS = {"train": 0, "val": 1, "test": 2}


@dataclass(frozen=True, eq=False)  # eq=False: arrays compared field by field have no single truth value
class Scenes:
    """A split's scenes: pixels, what stands in each cell, and the reference captions."""

    pixels: np.ndarray  # uint8 (N, 64, 64)
    cells: np.ndarray  # int64 (N, 4): the label in each cell (CELL_NAMES order), -1 where empty
    sources: np.ndarray  # int64 (N, 4): the pasted image's index in its IDX file (or pool), -1 where empty
    captions: list[list[str]]  # N lists of CAPTIONS strings

    def __len__(self) -> int:
        return len(self.pixels)

    def objects(self, i: int) -> list[tuple[str, str]]:
        """(cell, kind) of each garment of scene ``i``, in cell order: [("top left", "coat"), ...]."""
        return [(CELL_NAMES[j], CLASS_WORDS[c][0]) for j, c in enumerate(self.cells[i].tolist()) if c >= 0]


def compose_scenes(images: np.ndarray, labels: np.ndarray, n: int, rng: np.random.Generator) -> Scenes:
    """``n`` scenes from a pool of uint8 images (M, 28, 28) with labels 0-9 (M,); sources index the pool."""
    counts = draw_counts(images, labels, n, 3, rng)
    order = rng.permutation(len(images))[: counts.sum()]
    pixels = np.zeros((n, CANVAS, CANVAS), np.uint8)
    cells, sources = np.full((n, 4), -1, np.int64), np.full((n, 4), -1, np.int64)
    captions, used = [], 0
    for i, k in enumerate(counts.tolist()):
        for cell, source in zip(rng.choice(4, size=k, replace=False).tolist(), order[used:used + k].tolist()):
            top, left = CELL * (cell // 2) + PAD, CELL * (cell % 2) + PAD
            pixels[i, top:top + 28, left:left + 28] = images[source]
            cells[i, cell], sources[i, cell] = int(labels[source]), source
        used += k
        captions.append(scene_captions(cells[i], rng))
    return Scenes(pixels, cells, sources, captions)


def draw_counts(images: np.ndarray, labels: np.ndarray, n: int, most: int, rng: np.random.Generator,
                whole_pool: bool = True) -> np.ndarray:
    """The garments of each of ``n`` scenes, uniform in 1..``most``, checked to fit in the pool (uint8 images
    (M, 28, 28), labels (M,)) without replacement (``whole_pool``) or, where images may come again, that the pool
    holds one."""
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (28, 28) or labels.shape != images.shape[:1]:
        raise ValueError(f"need uint8 images (M, 28, 28) and labels (M,), got {images.dtype} {images.shape} "
                         f"and {labels.shape}")
    if n < 0:
        raise ValueError(f"the number of scenes must be at least 0, got {n}")
    counts = rng.integers(1, most + 1, size=n)
    if not whole_pool:
        if n and not len(images):
            raise ValueError(f"{n} scenes need images; the pool holds none")
        return counts
    if counts.sum() > len(images):
        raise ValueError(f"{n} scenes need {counts.sum()} images without replacement; the pool holds {len(images)}")
    return counts


def scene_captions(cells: np.ndarray, rng: np.random.Generator) -> list[str]:
    """The five reference captions of a scene whose cells hold ``cells`` (4 labels, -1 where empty)."""
    garments = [(j, c) for j, c in enumerate(np.asarray(cells).tolist()) if c >= 0]
    if not 1 <= len(garments) <= 3:
        raise ValueError(f"a scene holds 1 to 3 garments, got {len(garments)}")
    if len(garments) == 1:
        families = ["count", "total", "where", "side", "empty"]
    else:
        extra = ("total", "side", "empty")
        families = ["count", "where", "relation", *(extra[e] for e in sorted(rng.choice(3, 2, replace=False)))]
    return [_FAMILIES[families[f]](garments, rng) for f in rng.permutation(CAPTIONS).tolist()]


def fashion_scenes(fashion_dir: str | os.PathLike, split: str, n: int | None = None, seed: int = 0,
                   holdout: int = HOLDOUT) -> Scenes:
    """The scenes of ``split`` (train, val, test; ``n`` of them, default :data:`SCENE_SPLITS`) from the
    Fashion-MNIST IDX files in ``fashion_dir``; sources index the split's IDX file."""
    return compose_split(compose_scenes, DATASET, _SPLIT_SEEDS, fashion_dir, split, n, seed, holdout)


def compose_split(compose, name: str, streams: dict[str, int], fashion_dir: str | os.PathLike, split: str,
                  n: int | None, seed: int, holdout: int):
    """``compose(images, labels, n, rng)`` over ``split``'s pool (:func:`split_pool`) with the generator
    ``np.random.default_rng([seed, streams[split]])``; its ``sources`` made indices into the split's IDX file."""
    images, labels, start = split_pool(fashion_dir, split, holdout)
    rng = np.random.default_rng([seed, streams[split]])
    try:
        scenes = compose(images, labels, SCENE_SPLITS[split] if n is None else n, rng)
    except ValueError as exc:
        raise ValueError(f"{name} {split}: {exc}") from None
    return dataclasses.replace(scenes, sources=np.where(scenes.sources >= 0, scenes.sources + start, -1))


def split_pool(fashion_dir: str | os.PathLike, split: str, holdout: int = HOLDOUT) -> tuple[np.ndarray, np.ndarray, int]:
    """The pool ``split`` (train, val, test) draws its images from: uint8 images (M, 28, 28), labels (M,) and the
    index of its first image in its IDX file (train: the training images but the last ``holdout``; val: those;
    test: t10k)."""
    if split not in SCENE_SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(SCENE_SPLITS)}")
    images, labels = _read_fashion(Path(fashion_dir), "test" if split == "test" else "train")
    start, stop = 0, len(images)
    if split != "test":
        if not 0 < holdout < len(images):
            raise ValueError(f"holdout must be between 1 and {len(images) - 1} (the training images but one), "
                             f"got {holdout}")
        start, stop = (len(images) - holdout, len(images)) if split == "val" else (0, len(images) - holdout)
    return images[start:stop], labels[start:stop], start


def _read_fashion(root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images (N, 28, 28) and int64 labels (N,) of one IDX split, checked as :mod:`.idx` checks them."""
    paths = []
    for name in idx.IDX_FILES[split]:
        found = idx.find_idx_file(root, name)
        if found is None:
            raise FileNotFoundError(f"{root / name}.gz: no such file (nor {name})")
        paths.append(found)
    x, y = idx.read_idx_split(*paths)
    if len(y) and (y.min() < 0 or y.max() > 9):
        raise ValueError(f"{paths[1]}: labels must be 0-9 (Fashion-MNIST's classes), found {int(y.max())}")
    return x[:, 0, PAD:-PAD, PAD:-PAD].numpy(), y.numpy()


# The caption families (see the module docstring); each takes [(cell, label), ...] and the generator.
def _np(label: int, n: int = 1) -> str:
    if n > 1:
        return f"{NUMBERS[n]} {CLASS_WORDS[label][1]}"
    word = CLASS_WORDS[label][0]
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _inventory(garments: list[tuple[int, int]], rng: np.random.Generator) -> list[str]:
    counts = Counter(c for _, c in garments)
    kinds = sorted(counts)
    return [_np(kinds[i], counts[kinds[i]]) for i in rng.permutation(len(kinds)).tolist()]


def _count(garments: list[tuple[int, int]], rng: np.random.Generator) -> str:
    parts = _inventory(garments, rng)
    there = "there is " if parts[0].startswith(("a ", "an ")) else "there are "
    return ("", there, "a picture of ", "an image of ")[int(rng.integers(4))] + _join(parts)


def _total(garments: list[tuple[int, int]], rng: np.random.Generator) -> str:
    k = len(garments)
    return f"{NUMBERS[k]} item{'s' if k > 1 else ''}: {_join(_inventory(garments, rng))}"


def _where(garments: list[tuple[int, int]], rng: np.random.Generator) -> str:
    order = rng.permutation(len(garments)).tolist()
    return _join([f"{_np(garments[i][1])} in the {CELL_NAMES[garments[i][0]]} corner" for i in order])


def _side(garments: list[tuple[int, int]], rng: np.random.Generator) -> str:
    m = 1 if len(garments) == 1 else int(rng.integers(1, 3))
    parts = []
    for i in rng.choice(len(garments), m, replace=False).tolist():
        cell, label = garments[i]
        row, col = divmod(cell, 2)
        side = ("at the top", "at the bottom")[row] if rng.integers(2) == 0 else ("on the left", "on the right")[col]
        parts.append(f"{_np(label)} {side}")
    return _join(parts)


def _relation(garments: list[tuple[int, int]], rng: np.random.Generator) -> str:
    pairs = list(itertools.combinations(garments, 2))
    straight = [(a, b) for a, b in pairs if a[0] // 2 == b[0] // 2 or a[0] % 2 == b[0] % 2]
    pool = straight or pairs  # a diagonal pair only where no pair shares a row or a column
    m = 1 if len(pool) == 1 else int(rng.integers(1, 3))
    parts = []
    for i in rng.choice(len(pool), m, replace=False).tolist():
        a, b = pool[i] if rng.integers(2) == 0 else pool[i][::-1]
        parts.append(f"{_np(a[1])} {_rel(a[0], b[0])} {_np(b[1])}")
    return _join(parts)


def _rel(a: int, b: int) -> str:
    """How cell ``a`` stands to cell ``b``."""
    (ra, ca), (rb, cb) = divmod(a, 2), divmod(b, 2)
    if ra == rb:
        return "to the left of" if ca < cb else "to the right of"
    if ca == cb:
        return "above" if ra < rb else "below"
    return "diagonally across from"


def _empty(garments: list[tuple[int, int]], rng: np.random.Generator) -> str:
    empty = sorted(set(range(4)) - {cell for cell, _ in garments})
    cell = empty[int(rng.integers(len(empty)))]
    return f"{_join(_inventory(garments, rng))}, with nothing in the {CELL_NAMES[cell]} corner"


_FAMILIES = {"count": _count, "total": _total, "where": _where, "side": _side, "relation": _relation, "empty": _empty}
