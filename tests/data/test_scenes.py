"""fashion-mnist-scenes on a tiny Fashion-MNIST-format folder: determinism, captions parsed back and checked
against the scene, pixels where the metadata says, disjoint pools, the COCO files read back, no overwriting."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from skiplab.data.idx import IMAGES_MAGIC, LABELS_MAGIC, read_idx
from skiplab.data.scenes import CELL_NAMES, compose_scenes, fashion_scenes, scene_captions
from skiplab.data import scene_files
from skiplab.data.scene_files import write_scenes
from skiplab.data.captions import ImageFolder, read_coco_captions, read_karpathy, tokenize
from tests.conftest import write_fashion_mnist

HOLDOUT = 64  # of the fixture's 256 training images
SIZES = {"train": 40, "val": 12, "test": 12}

# The grammar of the module docstring, written out again so the check does not share the generator's code.
WORDS = {
    "tee shirt": (0, 1), "tee shirts": (0, 2), "pair of trousers": (1, 1), "pairs of trousers": (1, 2),
    "pullover": (2, 1), "pullovers": (2, 2), "dress": (3, 1), "dresses": (3, 2), "coat": (4, 1), "coats": (4, 2),
    "sandal": (5, 1), "sandals": (5, 2), "shirt": (6, 1), "shirts": (6, 2), "sneaker": (7, 1),
    "sneakers": (7, 2), "bag": (8, 1), "bags": (8, 2), "ankle boot": (9, 1), "ankle boots": (9, 2),
}
NUMBER = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,  # four to six: the hard set
          "seven": 7, "eight": 8}  # to eight: the crowded set
CELLS = {"top left": 0, "top right": 1, "bottom left": 2, "bottom right": 3}
NOUN = "|".join(sorted(map(re.escape, WORDS), key=len, reverse=True))
NP = rf"(?:a|an|two|three) (?:{NOUN})"
SIDES = {"at the top": lambda j: j // 2 == 0, "at the bottom": lambda j: j // 2 == 1,
         "on the left": lambda j: j % 2 == 0, "on the right": lambda j: j % 2 == 1}
RELATIONS = {
    "to the left of": lambda a, b: a // 2 == b // 2 and a % 2 < b % 2,
    "to the right of": lambda a, b: a // 2 == b // 2 and a % 2 > b % 2,
    "above": lambda a, b: a % 2 == b % 2 and a // 2 < b // 2,
    "below": lambda a, b: a % 2 == b % 2 and a // 2 > b // 2,
    "diagonally across from": lambda a, b: a // 2 != b // 2 and a % 2 != b % 2,
}


def noun_phrase(text: str) -> tuple[int, int]:
    """(label, number) of "a bag" / "an ankle boot" / "two bags"; the article and the noun must agree."""
    article, noun = text.split(" ", 1)
    label, form = WORDS[noun]
    n = NUMBER[article]
    assert (n == 1) == (form == 1), text
    if n == 1:
        assert article == ("an" if noun[0] in "aeiou" else "a"), text
    return label, n


def clauses(text: str) -> list[str]:
    return re.split(r", | and ", text)


def check_inventory(text: str, cells: list[int]) -> None:
    """``text`` names every kind in the scene once, with its count, and nothing else."""
    named = [noun_phrase(part) for part in clauses(text)]
    assert len({label for label, _ in named}) == len(named), text
    assert dict(named) == Counter(c for c in cells if c >= 0), text


def check_caption(caption: str, cells: list[int]) -> str:
    """Assert ``caption`` is true of the scene whose cells hold ``cells``; return its family."""
    at = {j: c for j, c in enumerate(cells) if c >= 0}

    def somewhere(np_text: str, where) -> None:
        label, n = noun_phrase(np_text)
        assert n == 1 and any(c == label and where(j) for j, c in at.items()), caption

    if m := re.fullmatch(r"(one|two|three) (items?): (.*)", caption):
        assert NUMBER[m[1]] == len(at) and (m[2] == "item") == (len(at) == 1), caption
        check_inventory(m[3], cells)
        return "total"
    if m := re.fullmatch(r"(.*), with nothing in the (\w+ \w+) corner", caption):
        assert cells[CELLS[m[2]]] == -1, caption
        check_inventory(m[1], cells)
        return "empty"
    if m := re.fullmatch(r"(there is |there are |a picture of |an image of |)(.*)", caption):
        if all(re.fullmatch(NP, part) for part in clauses(m[2])):
            if m[1].startswith("there"):
                assert (m[1] == "there is ") == (noun_phrase(clauses(m[2])[0])[1] == 1), caption
            check_inventory(m[2], cells)
            return "count"
    families = set()
    for part in clauses(caption):
        if m := re.fullmatch(rf"({NP}) in the (\w+ \w+) corner", part):
            somewhere(m[1], lambda j, cell=CELLS[m[2]]: j == cell)
            families.add("where")
        elif m := re.fullmatch(rf"({NP}) ({'|'.join(SIDES)})", part):
            somewhere(m[1], SIDES[m[2]])
            families.add("side")
        elif m := re.fullmatch(rf"({NP}) ({'|'.join(RELATIONS)}) ({NP})", part):
            (a, na), (b, nb) = noun_phrase(m[1]), noun_phrase(m[3])
            holds = RELATIONS[m[2]]
            assert na == nb == 1 and any(holds(i, j) for i in at for j in at if at[i] == a and at[j] == b), caption
            families.add("relation")
        else:
            raise AssertionError(f"not in the grammar: {caption!r} ({part!r})")
    assert len(families) == 1, caption
    if families == {"where"}:  # the where family places every garment
        assert len(clauses(caption)) == len(at), caption
    return families.pop()


@pytest.fixture(scope="module")
def splits(fashion_dir):
    return {s: fashion_scenes(fashion_dir, s, n, seed=3, holdout=HOLDOUT) for s, n in SIZES.items()}


def test_shapes_and_metadata(splits):
    scenes = splits["train"]
    assert scenes.pixels.shape == (40, 64, 64) and scenes.pixels.dtype == np.uint8
    assert scenes.cells.shape == scenes.sources.shape == (40, 4)
    assert all(1 <= (row >= 0).sum() <= 3 for row in scenes.cells)
    assert np.array_equal(scenes.cells >= 0, scenes.sources >= 0)
    assert len(scenes.captions) == 40 and all(len(c) == 5 and len(set(c)) == 5 for c in scenes.captions)
    first = scenes.objects(0)
    assert [cell for cell, _ in first] == [CELL_NAMES[j] for j in np.flatnonzero(scenes.cells[0] >= 0)]


def test_same_seed_same_bytes_other_seed_differs(fashion_dir, splits):
    again = fashion_scenes(fashion_dir, "train", 40, seed=3, holdout=HOLDOUT)
    ref = splits["train"]
    assert again.pixels.tobytes() == ref.pixels.tobytes() and again.captions == ref.captions
    assert np.array_equal(again.cells, ref.cells) and np.array_equal(again.sources, ref.sources)
    other = fashion_scenes(fashion_dir, "train", 40, seed=4, holdout=HOLDOUT)
    assert other.pixels.tobytes() != ref.pixels.tobytes() and other.captions != ref.captions
    rng_a, rng_b = np.random.default_rng(9), np.random.default_rng(9)
    cells = np.array([8, -1, 4, 8])
    assert scene_captions(cells, rng_a) == scene_captions(cells, rng_b)


def test_every_caption_is_true(splits):
    seen = Counter()
    for scenes in splits.values():
        for cells, captions in zip(scenes.cells.tolist(), scenes.captions):
            families = [check_caption(c, cells) for c in captions]
            assert len(set(families)) == 5, captions  # five different families
            k = sum(c >= 0 for c in cells)
            assert {"count", "where"} <= set(families) and (k == 1) != ("relation" in families)
            seen.update(families)
    assert set(seen) == {"count", "total", "where", "side", "relation", "empty"}


@pytest.mark.parametrize("cells", [[8, 8, -1, 4], [-1, 3, 7, -1], [0, -1, -1, 9], [-1, -1, 1, -1], [6, 6, 6, -1]])
def test_captions_of_hand_made_scenes(cells):
    for seed in range(20):
        captions = scene_captions(np.array(cells), np.random.default_rng(seed))
        assert len(set(captions)) == 5
        for caption in captions:
            check_caption(caption, cells)


def test_a_false_caption_is_caught():
    cells = [8, 8, -1, 4]  # two bags on top, a coat bottom right
    check_caption("two bags and a coat", cells)
    check_caption("a bag to the left of a bag and a coat below a bag", cells)
    for wrong in ["a bag and a coat", "two bags", "a bag below a coat", "a coat in the top left corner",
                  "two items: two bags and a coat", "two bags and a coat, with nothing in the top left corner",
                  "a coat on the left", "a bag diagonally across from a bag", "two bag and a coat"]:
        with pytest.raises((AssertionError, KeyError)):
            check_caption(wrong, cells)


def test_pixels_land_where_the_metadata_says(fashion_dir, splits):
    files = {"train": "train", "val": "train", "test": "t10k"}
    for split, scenes in splits.items():
        source = read_idx(fashion_dir / f"{files[split]}-images-idx3-ubyte.gz", IMAGES_MAGIC)
        for pixels, cells, sources in zip(scenes.pixels, scenes.cells, scenes.sources):
            rest = pixels.copy()
            for j in range(4):
                top, left = 32 * (j // 2) + 2, 32 * (j % 2) + 2
                window = pixels[top:top + 28, left:left + 28]
                if cells[j] < 0:
                    assert not window.any()
                else:
                    assert np.array_equal(window, source[sources[j]])
                rest[top:top + 28, left:left + 28] = 0
            assert not rest.any()  # the 2-pixel borders of every cell are empty


def test_labels_match_the_idx_labels(fashion_dir, splits):
    labels = read_idx(fashion_dir / "train-labels-idx1-ubyte.gz", LABELS_MAGIC)
    scenes = splits["train"]
    kept = scenes.sources >= 0
    assert np.array_equal(scenes.cells[kept], labels[scenes.sources[kept]])


def test_splits_draw_from_disjoint_pools(splits):
    used = {s: sc.sources[sc.sources >= 0] for s, sc in splits.items()}
    for s, ids in used.items():
        assert len(set(ids.tolist())) == len(ids), s  # without replacement within a split
    assert used["train"].max() < 256 - HOLDOUT <= used["val"].min() and used["val"].max() < 256
    assert used["test"].max() < 64  # t10k indices


def test_pool_too_small(fashion_dir):
    with pytest.raises(ValueError, match=r"fashion-mnist-scenes val: 40 scenes need \d+ images without replacement; "
                                         r"the pool holds 10") as err:
        fashion_scenes(fashion_dir, "val", 40, holdout=10)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="holdout must be between 1 and 255"):
        fashion_scenes(fashion_dir, "train", 4, holdout=256)
    with pytest.raises(ValueError, match="unknown split 'valid'; known: train, val, test"):
        fashion_scenes(fashion_dir, "valid", 4)
    with pytest.raises(ValueError, match="need uint8 images"):
        compose_scenes(np.zeros((3, 32, 32), np.uint8), np.zeros(3), 1, np.random.default_rng(0))


def test_missing_idx_file_is_named(tmp_path):
    root = write_fashion_mnist(tmp_path / "fm", n_train=8, n_test=4)
    (root / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError) as err:
        fashion_scenes(root, "test", 1)
    assert str(err.value) == f"{root / 't10k-labels-idx1-ubyte'}.gz: no such file (nor t10k-labels-idx1-ubyte)"


@pytest.fixture(scope="module")
def written(fashion_dir, tmp_path_factory):
    return write_scenes(fashion_dir, tmp_path_factory.mktemp("scenes") / "out", SIZES, seed=3, holdout=HOLDOUT)


def test_writer_output_reads_back(written, splits):
    assert sorted(p.name for p in written.iterdir()) == [
        "captions_test.json", "captions_train.json", "captions_val.json", "dataset.json", "images", "scenes.json"]
    assert len(list((written / "images").iterdir())) == sum(SIZES.values())
    karpathy = read_karpathy(written / "dataset.json")
    assert [r.split for r in karpathy] == [s for s, n in SIZES.items() for _ in range(n)]
    assert len({r.id for r in karpathy}) == len(karpathy)
    for split, scenes in splits.items():
        coco = read_coco_captions(written / f"captions_{split}.json")
        assert [r.raw for r in coco] == scenes.captions
        assert [r.captions for r in coco] == [[tokenize(c) for c in caps] for caps in scenes.captions]
        images = ImageFolder(written / "images")  # size checked against the file's height and width
        assert all(r.height == r.width == 64 for r in coco)
        assert np.array_equal(np.stack([images[r] for r in coco]), scenes.pixels)
        ks = read_karpathy(written / "dataset.json", split)
        assert [r.id for r in ks] == [r.id for r in coco] and [r.raw for r in ks] == scenes.captions
        assert [r.captions for r in ks] == [r.captions for r in coco]
        assert np.array_equal(np.stack([ImageFolder(written, size=(64, 64))[r] for r in ks]), scenes.pixels)


def test_writer_is_deterministic_and_refuses_to_overwrite(fashion_dir, written, tmp_path):
    again = write_scenes(fashion_dir, tmp_path / "again", SIZES, seed=3, holdout=HOLDOUT)
    files = sorted(p.relative_to(written) for p in written.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    assert all((written / f).read_bytes() == (again / f).read_bytes() for f in files)
    before = (again / "dataset.json").read_bytes()
    with pytest.raises(FileExistsError) as err:
        write_scenes(fashion_dir, again, {"test": 2}, seed=5, holdout=HOLDOUT)
    assert str(err.value) == f"{again}: already exists and is not an empty folder; refusing to overwrite it"
    assert (again / "dataset.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again"]  # nothing partial left behind


def test_writer_fills_an_empty_folder_and_leaves_nothing_on_failure(fashion_dir, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    write_scenes(fashion_dir, empty, {"test": 2}, holdout=HOLDOUT)
    assert (empty / "captions_test.json").is_file() and not (empty / "captions_train.json").exists()
    with pytest.raises(ValueError, match="the pool holds 64"):
        write_scenes(fashion_dir, tmp_path / "big", {"test": 100})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


def test_writer_removes_a_partial_folder(fashion_dir, tmp_path, monkeypatch):
    def fail(path, data):
        raise OSError(f"{path}: disk full")

    monkeypatch.setattr(scene_files, "_dump", fail)
    with pytest.raises(OSError, match="disk full"):
        write_scenes(fashion_dir, tmp_path / "out", {"test": 2})
    assert list(tmp_path.iterdir()) == []


def test_caption_words(splits):
    """The 52 words of the grammar; none has a hyphen or an apostrophe, so Karpathy's tokenisation and the
    COCO toolkit's PTB tokenizer agree (both drop the "," and ":")."""
    grammar = set("""a an and are at is of on to in the with from there picture image nothing one two three item items
        top bottom left right corner above below diagonally across tee shirt shirts pair pairs trousers
        pullover pullovers
        dress dresses coat coats sandal sandals sneaker sneakers bag bags ankle boot boots""".split())
    words = {t for scenes in splits.values() for caps in scenes.captions for c in caps for t in tokenize(c)}
    assert len(grammar) == 52 and words <= grammar and len(words) > 40
    captions = [c for scenes in splits.values() for caps in scenes.captions for c in caps]
    assert all(c.replace(",", "").replace(":", "").split() == tokenize(c) for c in captions)
