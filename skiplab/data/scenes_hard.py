"""fashion-mnist-scenes-hard: the harder variant of :mod:`.scenes`, on the same 64x64 canvas so that a run costs
about what one on the easy set does (the same encoder sequence; captions of at most 30 words).

A scene is a 64x64 grey canvas (uint8, background 0) cut into a 3x3 grid of 21x21 cells (rows and columns 0-62;
the last row and column of pixels stay 0), numbered 0-8 row by row (cell j: row j // 3, column j % 3):

    top left      top middle      top right
    middle left   centre          middle right
    bottom left   bottom middle   bottom right

It holds k garments, k uniform in {1, ..., 6}, in k distinct cells chosen uniformly. Each garment is a
Fashion-MNIST image with two drawn attributes, each uniform:

    size   small: resized to 12x12; large: resized to 20x20, by area averaging (each output pixel the mean of the
           input over its square, as OpenCV's INTER_AREA): out = A x A^T with A (s, 28),
           A[i, j] = (s / 28) * |[i 28/s, (i+1) 28/s) ∩ [j, j+1)|
    tone   dark: scaled so that its brightest pixel is 96; bright: so that it is 255:
           pixel = round(out * T / max(out)) (T = 96 or 255; an all-zero image stays 0)

pasted into its cell at an offset (dy, dx), each uniform in {0, ..., 21 - s}: pixel (r, c) of the garment at
(21 * row + dy + r, 21 * column + dx + c). Images are drawn without replacement from the split's pool, as for the
easy set (the same pools and splits: train from Fashion-MNIST's training images but the last ``holdout``, val from
those, test from t10k; 12,000 / 1,000 / 1,000 scenes by default). Each split's generator is
``np.random.default_rng([seed, 10 + {"train": 0, "val": 1, "test": 2}[split]])`` (other streams than the easy
set's), drawn in a fixed order: the k of every scene, the pool's order, then per scene its cells, sizes, tones,
offsets and captions.

Five reference captions a scene, each from a different family, each true of the scene (NUMBER runs to six;
NP(c, n) and LIST are the easy set's, INVENTORY lists every kind with its count):

    NP+(g)     "a " SIZE " " TONE " " SINGULAR[c]                       "a small dark coat"
    REF(g)     "the " [SIZE " "] [TONE " "] SINGULAR[c]: the fewest attributes, tried in the order none, size,
               tone, both, that no other garment of the scene shares: "the coat" where the scene has one coat,
               "the small coat" where it has two coats of different sizes (its distractors); a garment that no
               description sets apart (another of its kind, size and tone) has no REF
    REL(a, b)  "above" | "below" where a's row is higher | lower than b's, else "to the left of" | "to the right of"

    count      PREFIX INVENTORY (the easy set's count family)          "there are three shirts and a bag"
    total      NUMBER[k] " item" | " items" ": " INVENTORY             "five items: three shirts, a bag and a coat"
    where      LIST(NP+(g) " in the " CELL[g]) for min(k, 3) garments drawn at random, in cell order
                                                   "a small dark coat in the top left and a large bright bag in the centre"
    attribute  size or tone at random; per value present, in the order small, large (dark, bright):
               VALUE ": " INVENTORY(the garments of that value), joined by "; "
                                                   "small: two shirts and a bag; large: a coat"
    relation   LIST(REF(a) " is " REL(a, b) " " REF(b)) for 1 or 2 pairs drawn among the garments that have a REF
                                                   "the dark shirt is above the bag"
    empty      INVENTORY ", with nothing in the " CELL (an empty cell drawn at random)
                                                   "a coat and two bags, with nothing in the centre"

A scene of one garment gets count, total, where, attribute and empty; a scene of two or more, where two garments
have a REF, gets count, where, attribute, relation and one of total and empty; otherwise (no such pair: every
garment has a twin of its kind, size and tone) count, total, where, attribute and empty; the five in random
order. A where or relation caption keeps as many of its drawn parts, in order, as fit in :data:`MAX_WORDS` (30)
words, at least one; every caption has at most 30 (the cpu setting's ``max_caption_len``). The words are the easy
set's kinds, "one" to "six", the cells, "small", "large", "dark", "bright" and the few glue words.

What it asks beyond the easy set: up to six garments, 12-pixel garments and dark ones (a 12x12 dark pair of
trousers is a few grey pixels); counts to six; nine cells; attributes read from the pixels; and relations that
need a garment told apart from others of its kind.

The code is shared with :mod:`.scenes_crowded`: what tells the two sets apart is a :class:`SceneRules` (this set's
:data:`HARD`), which every function here takes, the hard set's by default.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
from dataclasses import dataclass

import numpy as np

from .scenes import CLASS_WORDS, HOLDOUT, _count, _inventory, _join, _np, _total, compose_split, draw_counts

DATASET = "fashion-mnist-scenes-hard"
CANVAS, GRID, CELL = 64, 3, 21  # 3 x 21 = 63
CELL_NAMES = ("top left", "top middle", "top right", "middle left", "centre", "middle right", "bottom left",
              "bottom middle", "bottom right")
SIZES = (("small", 12), ("large", 20))  # (word, pixels a side)
TONES = (("dark", 96), ("bright", 255))  # (word, brightest pixel)
MAX_GARMENTS = 6
MAX_WORDS = 30
CAPTIONS = 5
_WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class SceneRules:
    """What tells the 3x3 composed sets apart (each set's module docstring gives its values' meaning): the canvas,
    grid, pools, caption families other than where, and the 30-word bound are common to all."""

    name: str  # the dataset's name
    streams: tuple[int, int, int]  # the generators' second seeds for train, val, test
    max_garments: int  # k uniform in 1..max_garments
    sizes: tuple[tuple[str, int], ...] = SIZES  # (word, pixels a side): small, large
    tones: tuple[tuple[str, int], ...] = TONES  # (word, brightest pixel): dark, bright
    where_garments: int = 3  # the where family describes min(k, where_garments) garments
    where_attributes: bool = True  # ... each as NP+ (size, tone, kind) or NP(c, 1) (the kind alone)
    scene_kinds: tuple[int, ...] = ()  # () images in the pool's order, any kinds; else a scene's number of kinds
    # is min(k, M), M drawn uniformly from these, and each kind's images come in an order of their own

    def split_streams(self) -> dict[str, int]:
        return dict(zip(("train", "val", "test"), self.streams))


HARD = SceneRules(DATASET, streams=(10, 11, 12), max_garments=MAX_GARMENTS)


@dataclass(frozen=True, eq=False)
class HardScenes:
    """A split's scenes: pixels, what stands in each cell (-1 where empty) and how, and the reference captions."""

    pixels: np.ndarray  # uint8 (N, 64, 64)
    cells: np.ndarray  # int64 (N, 9): the label in each cell (CELL_NAMES order), -1 where empty
    sizes: np.ndarray  # int64 (N, 9): 0 small, 1 large (SIZES), -1 where empty
    tones: np.ndarray  # int64 (N, 9): 0 dark, 1 bright (TONES), -1 where empty
    offsets: np.ndarray  # int64 (N, 9, 2): (dy, dx) of the garment in its cell, -1 where empty
    sources: np.ndarray  # int64 (N, 9): the pasted image's index in its IDX file (or pool), -1 where empty
    captions: list[list[str]]  # N lists of CAPTIONS strings

    def __len__(self) -> int:
        return len(self.pixels)

    def garments(self, i: int) -> list[tuple[int, int, int, int]]:
        """(cell, label, size, tone) of each garment of scene ``i``, in cell order."""
        return [(j, c, self.sizes[i, j].item(), self.tones[i, j].item())
                for j, c in enumerate(self.cells[i].tolist()) if c >= 0]


def area_matrix(s: int, n: int = 28) -> np.ndarray:
    """A (s, n): A[i, j] = (s / n) * the length of [i n/s, (i+1) n/s) ∩ [j, j+1), so that A x A^T resizes an n x n
    image to s x s by area averaging (each row of A sums to 1)."""
    edges = np.arange(s + 1) * n / s
    lo, hi = edges[:-1, None], edges[1:, None]
    j = np.arange(n)[None, :]
    return np.clip(np.minimum(hi, j + 1) - np.maximum(lo, j), 0, None) * s / n


def garment_pixels(image: np.ndarray, size: int, tone: int, rules: SceneRules = HARD) -> np.ndarray:
    """A 28x28 uint8 image resized to ``rules.sizes[size]`` and scaled to ``rules.tones[tone]`` (module
    docstring)."""
    a = _area(rules.sizes[size][1])
    out = a @ image.astype(np.float64) @ a.T
    top = out.max()
    return np.zeros_like(out, np.uint8) if top == 0 else np.rint(out * rules.tones[tone][1] / top).astype(np.uint8)


@functools.lru_cache(maxsize=None)
def _area(side: int) -> np.ndarray:
    return area_matrix(side)


def compose_hard_scenes(images: np.ndarray, labels: np.ndarray, n: int, rng: np.random.Generator,
                        rules: SceneRules = HARD) -> HardScenes:
    """``n`` scenes from a pool of uint8 images (M, 28, 28) with labels 0-9 (M,) by ``rules``; sources index the
    pool."""
    counts = draw_counts(images, labels, n, rules.max_garments, rng, whole_pool=not rules.scene_kinds)
    pick = _by_kinds(labels, rng, rules.scene_kinds) if rules.scene_kinds else _in_pool_order(len(images), counts, rng)
    cells_n = GRID * GRID
    pixels = np.zeros((n, CANVAS, CANVAS), np.uint8)
    cells, sizes, tones, sources = (np.full((n, cells_n), -1, np.int64) for _ in range(4))
    offsets = np.full((n, cells_n, 2), -1, np.int64)
    captions = []
    for i, k in enumerate(counts.tolist()):
        chosen = pick(k)
        where = rng.choice(cells_n, size=k, replace=False)
        size, tone = rng.integers(0, 2, size=k), rng.integers(0, 2, size=k)
        spare = CELL - np.array([rules.sizes[s][1] for s in size.tolist()])
        shift = rng.integers(0, spare[:, None] + 1, size=(k, 2))
        for g, (cell, source) in enumerate(zip(where.tolist(), chosen)):
            side = rules.sizes[size[g]][1]
            top, left = CELL * (cell // GRID) + shift[g, 0], CELL * (cell % GRID) + shift[g, 1]
            pixels[i, top:top + side, left:left + side] = garment_pixels(images[source], size[g], tone[g], rules)
            cells[i, cell], sources[i, cell] = int(labels[source]), source
            sizes[i, cell], tones[i, cell], offsets[i, cell] = size[g], tone[g], shift[g]
        garments = [(j, cells[i, j].item(), sizes[i, j].item(), tones[i, j].item())
                    for j in range(cells_n) if cells[i, j] >= 0]
        captions.append(hard_scene_captions(garments, rng, rules))
    return HardScenes(pixels, cells, sizes, tones, offsets, sources, captions)


def _in_pool_order(m: int, counts: np.ndarray, rng: np.random.Generator):
    """The pool's images in one random order, without replacement: each call takes the next ``k``."""
    order = rng.permutation(m)[: counts.sum()].tolist()
    used = 0

    def pick(k: int) -> list[int]:
        nonlocal used
        used += k
        return order[used - k:used]
    return pick


def _by_kinds(labels: np.ndarray, rng: np.random.Generator, choices: tuple[int, ...]):
    """Each kind's images in a random order of their own (kinds 0-9 in turn), begun again where used up; a call
    for ``k`` garments draws M from ``choices``, min(k, M) distinct kinds among those the pool holds, gives the
    first garments one kind each and the rest a kind each uniformly, and takes each garment's kind's next image."""
    present = np.unique(labels)
    orders = {c: rng.permutation(np.flatnonzero(labels == c)).tolist() for c in present.tolist()}
    used = dict.fromkeys(orders, 0)

    def pick(k: int) -> list[int]:
        m = min(k, int(rng.choice(choices)), len(present))
        kinds = rng.choice(present, size=m, replace=False)
        drawn = np.concatenate([kinds, kinds[rng.integers(0, m, size=k - m)]]).tolist()
        out = []
        for c in drawn:
            out.append(orders[c][used[c] % len(orders[c])])
            used[c] += 1
        return out
    return pick


def hard_fashion_scenes(fashion_dir: str | os.PathLike, split: str, n: int | None = None, seed: int = 0,
                        holdout: int = HOLDOUT) -> HardScenes:
    """The scenes of ``split`` (train, val, test; ``n`` of them, default :data:`~.scenes.SCENE_SPLITS`) from the
    Fashion-MNIST IDX files in ``fashion_dir``; sources index the split's IDX file."""
    return rules_fashion_scenes(HARD, fashion_dir, split, n, seed, holdout)


def rules_fashion_scenes(rules: SceneRules, fashion_dir: str | os.PathLike, split: str, n: int | None = None,
                         seed: int = 0, holdout: int = HOLDOUT) -> HardScenes:
    """:func:`hard_fashion_scenes` by ``rules``: the generator ``np.random.default_rng([seed, stream])``, the stream
    ``rules.streams``' for the split."""
    compose = functools.partial(compose_hard_scenes, rules=rules)
    return compose_split(compose, rules.name, rules.split_streams(), fashion_dir, split, n, seed, holdout)


def words(caption: str) -> int:
    """A caption's number of words as Karpathy's tokenisation counts them (punctuation aside)."""
    return len(_WORD.findall(caption))


def hard_scene_captions(garments: list[tuple[int, int, int, int]], rng: np.random.Generator,
                        rules: SceneRules = HARD) -> list[str]:
    """The five reference captions of a scene of ``garments``, (cell, label, size, tone) in cell order, by
    ``rules``."""
    if not 1 <= len(garments) <= rules.max_garments:
        raise ValueError(f"a scene holds 1 to {rules.max_garments} garments, got {len(garments)}")
    refs = references(garments)
    if len(garments) > 1 and len(refs) >= 2:
        families = ["count", "where", "attribute", "relation", ("total", "empty")[int(rng.integers(2))]]
    else:
        families = ["count", "total", "where", "attribute", "empty"]
    return [_FAMILIES[families[f]](garments, rng, rules) for f in rng.permutation(CAPTIONS).tolist()]


def references(garments: list[tuple[int, int, int, int]]) -> dict[int, str]:
    """REF of each garment that has one (module docstring), by its index in ``garments``."""
    out = {}
    for i, (_, label, size, tone) in enumerate(garments):
        others = [g for j, g in enumerate(garments) if j != i and g[1] == label]
        for keep_size, keep_tone in ((False, False), (True, False), (False, True), (True, True)):
            if not any((not keep_size or g[2] == size) and (not keep_tone or g[3] == tone) for g in others):
                attrs = [SIZES[size][0]] * keep_size + [TONES[tone][0]] * keep_tone
                out[i] = " ".join(["the", *attrs, CLASS_WORDS[label][0]])
                break
    return out


def relation(a: int, b: int) -> str:
    """How cell ``a`` stands to cell ``b``: by rows where they differ, else by columns."""
    (ra, ca), (rb, cb) = divmod(a, GRID), divmod(b, GRID)
    if ra != rb:
        return "above" if ra < rb else "below"
    return "to the left of" if ca < cb else "to the right of"


def _fit(parts: list[str], join=_join) -> str:
    """The longest prefix of ``parts`` (at least one) whose joined caption has at most MAX_WORDS words."""
    m = len(parts)
    while m > 1 and words(join(parts[:m])) > MAX_WORDS:
        m -= 1
    return join(parts[:m])


def _pairs(garments: list[tuple[int, int, int, int]]) -> list[tuple[int, int]]:
    return [(g[0], g[1]) for g in garments]


# The caption families; each takes the garments, the generator and the set's rules (which only where reads; the
# words "small", "large", "dark", "bright" are every set's).
def _hard_count(garments, rng, rules):
    return _count(_pairs(garments), rng)


def _hard_total(garments, rng, rules):
    return _total(_pairs(garments), rng)


def _where(garments, rng, rules):
    chosen = sorted(rng.choice(len(garments), min(len(garments), rules.where_garments), replace=False).tolist())
    if not rules.where_attributes:
        return _fit([f"{_np(c)} in the {CELL_NAMES[j]}" for j, c, _, _ in (garments[i] for i in chosen)])
    return _fit([f"a {SIZES[s][0]} {TONES[t][0]} {CLASS_WORDS[c][0]} in the {CELL_NAMES[j]}"
                 for j, c, s, t in (garments[i] for i in chosen)])


def _attribute(garments, rng, rules):
    which = int(rng.integers(2))  # 0: size, 1: tone
    names = (SIZES, TONES)[which]
    parts = []
    for value in range(2):
        group = [g for g in garments if g[2 + which] == value]
        if group:
            parts.append(f"{names[value][0]}: {_join(_inventory(_pairs(group), rng))}")
    return "; ".join(parts)


def _relation(garments, rng, rules):
    refs = references(garments)
    pairs = list(itertools.combinations(sorted(refs), 2))
    m = 1 if len(pairs) == 1 else int(rng.integers(1, 3))
    parts = []
    for p in rng.choice(len(pairs), m, replace=False).tolist():
        a, b = pairs[p] if rng.integers(2) == 0 else pairs[p][::-1]
        parts.append(f"{refs[a]} is {relation(garments[a][0], garments[b][0])} {refs[b]}")
    return _fit(parts)


def _empty(garments, rng, rules):
    empty = sorted(set(range(GRID * GRID)) - {g[0] for g in garments})
    cell = empty[int(rng.integers(len(empty)))]
    return f"{_join(_inventory(_pairs(garments), rng))}, with nothing in the {CELL_NAMES[cell]}"


_FAMILIES = {"count": _hard_count, "total": _hard_total, "where": _where, "attribute": _attribute,
             "relation": _relation, "empty": _empty}
