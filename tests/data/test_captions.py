"""Caption readers on small files written in the official formats: COCO annotation JSON, Karpathy's split file,
Karpathy's tokenisation, the min-count vocabulary, image and feature folders, and their one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from skiplab.data.captions import (
    CaptionedImage,
    CaptionSet,
    FeatureFolder,
    ImageFolder,
    Vocabulary,
    read_coco_captions,
    read_image,
    read_karpathy,
    tokenize,
)

COCO = {
    "info": {"description": "COCO 2014 Dataset"},
    "licenses": [],
    "images": [
        {"id": 391895, "file_name": "COCO_val2014_000000391895.jpg", "height": 6, "width": 8, "license": 3},
        {"id": 522418, "file_name": "COCO_val2014_000000522418.jpg", "height": 5, "width": 4},
        {"id": 184613, "file_name": "COCO_val2014_000000184613.jpg", "height": 5, "width": 4},
    ],
    "annotations": [
        {"id": 1, "image_id": 522418, "caption": "A woman wearing a net on her head cutting a cake. "},
        {"id": 2, "image_id": 391895, "caption": "A man with a red helmet on a small moped on a dirt road. "},
        {"id": 3, "image_id": 522418, "caption": "A woman cutting a large white sheet cake."},
        {"id": 4, "image_id": 391895, "caption": "Man riding a motor bike on a dirt road on the countryside."},
    ],
}


def karpathy_image(imgid: int, split: str, raws: list[str], cocoid: int, folder: str = "val2014") -> dict:
    sentids = list(range(10 * imgid, 10 * imgid + len(raws)))
    return {
        "filepath": folder, "filename": f"COCO_{folder}_{cocoid:012d}.jpg", "imgid": imgid, "split": split,
        "sentences": [{"tokens": tokenize(r), "raw": r, "imgid": imgid, "sentid": s} for r, s in zip(raws, sentids)],
        "sentids": sentids, "cocoid": cocoid,
    }


KARPATHY = {
    "images": [
        karpathy_image(0, "test", ["A man with a red helmet on a small moped on a dirt road."], 391895),
        karpathy_image(1, "restval", ["A woman cutting a cake.", "Two people near a cake."], 522418),
        karpathy_image(2, "train", ["A dog on a couch."], 57870, folder="train2014"),
        karpathy_image(3, "val", ["A child holding a kite."], 184613),
    ],
    "dataset": "coco",
}


def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def one_line_error(kind, match, call, *args, **kwargs) -> str:
    with pytest.raises(kind, match=match) as err:
        call(*args, **kwargs)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_tokenize_is_karpathys():
    assert tokenize("A man's T-shirt, on 2 dogs!  ") == ["a", "man", "s", "t", "shirt", "on", "2", "dogs"]
    assert tokenize("Un café à Zürich") == ["un", "café", "à", "zürich"]
    assert tokenize("snake_case ... --") == ["snake", "case"]
    assert tokenize("") == [] and tokenize(" .,;! ") == []


def test_read_coco_captions(tmp_path):
    records = read_coco_captions(write_json(tmp_path / "captions_val2014.json", COCO))
    assert [r.id for r in records] == [391895, 522418, 184613]  # the "images" order
    first = records[0]
    assert first.file_name == "COCO_val2014_000000391895.jpg" and (first.height, first.width) == (6, 8)
    assert first.raw == [COCO["annotations"][1]["caption"], COCO["annotations"][3]["caption"]]  # annotation order
    assert first.captions[1] == "man riding a motor bike on a dirt road on the countryside".split()
    assert first.split is None
    assert records[2].captions == [] and records[2].raw == []


@pytest.mark.parametrize("damage, match", [
    (lambda d: d.pop("annotations"), "no 'annotations' list at the top level"),
    (lambda d: d.update(images={}), "no 'images' list at the top level"),
    (lambda d: d["annotations"][2].pop("caption"), r"annotations\[2\] has no str 'caption'"),
    (lambda d: d["annotations"][0].update(image_id=7), r"annotations\[0\]: image_id 7 is not among the images"),
    (lambda d: d["images"][1].update(id="522418"), r"images\[1\] has no int 'id'"),
    (lambda d: d["images"].append(d["images"][0]), r"images\[3\]: image id 391895 appears twice"),
])
def test_bad_coco_file(tmp_path, damage, match):
    data = json.loads(json.dumps(COCO))
    damage(data)
    path = write_json(tmp_path / "captions_train2014.json", data)
    message = one_line_error(ValueError, match, read_coco_captions, path)
    assert message.startswith(f"{path}: ")


def test_coco_file_missing_or_not_json(tmp_path):
    assert one_line_error(FileNotFoundError, "no such file", read_coco_captions, tmp_path / "absent.json") == (
        f"{tmp_path / 'absent.json'}: no such file")
    path = tmp_path / "captions.json"
    path.write_text('{"images": [}')
    assert one_line_error(ValueError, "not valid JSON", read_coco_captions, path).startswith(f"{path}: ")


def test_read_karpathy_splits(tmp_path):
    path = write_json(tmp_path / "dataset_coco.json", KARPATHY)
    everything = read_karpathy(path)
    assert [r.split for r in everything] == ["test", "train", "train", "val"]  # restval read as train
    train = read_karpathy(path, "train")
    assert [r.id for r in train] == [522418, 57870]  # cocoid
    assert train[0].file_name == "val2014/COCO_val2014_000000522418.jpg"
    assert train[0].captions == [["a", "woman", "cutting", "a", "cake"], ["two", "people", "near", "a", "cake"]]
    assert train[0].raw == ["A woman cutting a cake.", "Two people near a cake."]
    assert [r.id for r in read_karpathy(path, "val")] == [184613]
    assert [r.id for r in read_karpathy(path, "test")] == [391895]
    one_line_error(ValueError, "unknown split 'restval'; known: train, val, test", read_karpathy, path, "restval")


def test_karpathy_tokens_are_kept_and_made_where_missing(tmp_path):
    data = {"images": [{"filename": "a.jpg", "imgid": 5, "split": "train", "sentences": [
        {"tokens": ["kept", "AS", "given"], "raw": "Something else."},
        {"raw": "No tokens-here."},
    ]}]}
    (record,) = read_karpathy(write_json(tmp_path / "dataset_flickr8k.json", data))
    assert record.captions == [["kept", "AS", "given"], ["no", "tokens", "here"]]
    assert record.id == 5 and record.file_name == "a.jpg"  # no cocoid, no filepath (the Flickr files)


@pytest.mark.parametrize("damage, match", [
    (lambda d: d.pop("images"), "no 'images' list at the top level"),
    (lambda d: d["images"][2].update(split="dev"),
     r"images\[2\]: unknown split 'dev'; known: train, val, test, restval"),
    (lambda d: d["images"][1]["sentences"][1].update(tokens="a b"),
     r"images\[1\]\.sentences\[1\]: \"tokens\" is not a list of strings"),
    (lambda d: d["images"][3].pop("filename"), r"images\[3\] has no str 'filename'"),
])
def test_bad_karpathy_file(tmp_path, damage, match):
    data = json.loads(json.dumps(KARPATHY))
    damage(data)
    path = write_json(tmp_path / "dataset_coco.json", data)
    assert one_line_error(ValueError, match, read_karpathy, path).startswith(f"{path}: ")


def test_vocabulary_min_count_and_unk(tmp_path):
    captions = [["a", "dog", "runs"]] * 5 + [["a", "cat"]] * 4 + [["a", "zebra", "dog"]]
    vocab = Vocabulary.build(captions)  # min_count 5, the paper's
    assert vocab.words == ["<pad>", "<unk>", "<bos>", "<eos>", "a", "dog", "runs"]  # by count, then alphabet
    assert "cat" not in vocab and "dog" in vocab and len(vocab) == 7
    ids = vocab.encode(["a", "cat", "runs"])
    assert ids == [Vocabulary.BOS, 4, Vocabulary.UNK, 6, Vocabulary.EOS]
    assert vocab.encode(["zebra"], bos_eos=False) == [1]
    assert vocab.decode(ids) == "a <unk> runs"
    assert vocab.tokens([2, 5, 0, 6, 3, 4, 4]) == ["dog", "runs"]  # pad and bos skipped, stops at eos
    assert Vocabulary.build(captions, min_count=4).words[4:] == ["a", "dog", "runs", "cat"]
    assert Vocabulary.build([["y", "x", "z", "z"]], min_count=1).words[4:] == ["z", "x", "y"]  # ties: alphabet
    one_line_error(ValueError, "id 9 is out of range for a vocabulary of 7", vocab.decode, [4, 9])
    one_line_error(ValueError, "min_count must be at least 1", Vocabulary.build, captions, 0)


def test_vocabulary_save_load(tmp_path):
    vocab = Vocabulary.build([["b", "a", "b"]], min_count=1)
    path = tmp_path / "vocab.json"
    vocab.save(path)
    loaded = Vocabulary.load(path)
    assert loaded.words == ["<pad>", "<unk>", "<bos>", "<eos>", "b", "a"] and loaded.min_count == 1
    assert loaded.encode(["a", "c"]) == vocab.encode(["a", "c"])
    assert one_line_error(FileExistsError, "refusing to overwrite", vocab.save, path).startswith(f"{path}: ")
    assert Vocabulary.load(path).words == vocab.words
    bad = write_json(tmp_path / "other.json", {"format": "skiplab-caption-vocab", "words": ["a", "<pad>"]})
    assert one_line_error(ValueError, "starts with <pad>, <unk>, <bos>, <eos>", Vocabulary.load, bad).startswith(
        f"{bad}: ")
    one_line_error(ValueError, "not a caption vocabulary", Vocabulary.load, write_json(tmp_path / "x.json", [1]))


def record(id: int, file_name: str, height: int | None = None, width: int | None = None) -> CaptionedImage:
    return CaptionedImage(id, file_name, [["a", "cat"]], ["A cat."], height=height, width=width)


def test_image_folder(tmp_path):
    grey = np.arange(48, dtype=np.uint8).reshape(6, 8)
    colour = np.random.default_rng(0).integers(0, 256, (5, 4, 3), dtype=np.uint8)
    (tmp_path / "val2014").mkdir()
    Image.fromarray(grey).save(tmp_path / "val2014" / "g.png")
    Image.fromarray(colour).save(tmp_path / "val2014" / "c.png")
    folder = ImageFolder(tmp_path)
    assert np.array_equal(folder[record(1, "val2014/g.png", 6, 8)], grey)  # the record's size, checked
    assert np.array_equal(folder[record(2, "val2014/c.png")], colour)  # no size known: not checked
    rgb = ImageFolder(tmp_path, mode="RGB")[record(1, "val2014/g.png")]
    assert rgb.shape == (6, 8, 3) and np.array_equal(rgb[..., 1], grey)
    path = tmp_path / "val2014" / "c.png"
    message = one_line_error(ValueError, "image of 5x4", ImageFolder(tmp_path, size=(64, 64)).__getitem__,
                             record(2, "val2014/c.png"))
    assert message == f"{path}: image of 5x4 (height x width), expected 64x64"
    one_line_error(ValueError, "expected 4x5", folder.__getitem__, record(2, "val2014/c.png", 4, 5))
    missing = tmp_path / "val2014" / "absent.jpg"
    assert one_line_error(FileNotFoundError, "no such file", folder.__getitem__,
                          record(3, "val2014/absent.jpg")) == f"{missing}: no such file"
    (tmp_path / "junk.jpg").write_bytes(b"not an image")
    assert one_line_error(ValueError, "not a readable image", read_image, tmp_path / "junk.jpg").startswith(
        f"{tmp_path / 'junk.jpg'}: ")


def test_feature_folder(tmp_path):
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal((n, 4)).astype(np.float32) for n in (3, 3, 5))
    np.save(tmp_path / "391895.npy", a)
    np.savez_compressed(tmp_path / "522418.npz", feat=b)  # as self-critical.pytorch writes cocobu_att
    np.save(tmp_path / "COCO_val2014_000000184613.npy", c)  # found by the image file's stem
    folder = FeatureFolder(tmp_path)
    assert np.array_equal(folder[record(391895, "val2014/COCO_val2014_000000391895.jpg")], a)
    assert folder.shape == (3, 4)  # fixed by the first array read
    assert np.array_equal(folder[record(522418, "x.jpg")], b)
    message = one_line_error(ValueError, "features of shape", folder.__getitem__,
                             record(184613, "val2014/COCO_val2014_000000184613.jpg"))
    assert message == f"{tmp_path / 'COCO_val2014_000000184613.npy'}: features of shape (5, 4), expected (3, 4)"
    free = FeatureFolder(tmp_path, shape=(None, 4))  # a varying number of regions
    assert free[record(184613, "COCO_val2014_000000184613.jpg")].shape == (5, 4)
    one_line_error(ValueError, r"expected \(\*, 2048\)", FeatureFolder(tmp_path, shape=(None, 2048)).__getitem__,
                   record(391895, "a.jpg"))
    message = one_line_error(FileNotFoundError, "no such file", folder.__getitem__, record(7, "val2014/img7.jpg"))
    assert message == f"{tmp_path / '7.npy'}: no such file (nor 7.npz, img7.npy, img7.npz)"
    np.savez(tmp_path / "8.npz", features=a)
    message = one_line_error(ValueError, "no array named 'feat'", folder.__getitem__, record(8, "8.jpg"))
    assert message == f"{tmp_path / '8.npz'}: no array named 'feat' (found: features)"
    assert np.array_equal(FeatureFolder(tmp_path, key="features")[record(8, "8.jpg")], a)
    (tmp_path / "9.npy").write_bytes(b"junk")
    one_line_error(ValueError, "not a NumPy array file", folder.__getitem__, record(9, "9.jpg"))


def test_caption_set(tmp_path):
    np.save(tmp_path / "1.npy", np.ones((2, 3)))
    Image.fromarray(np.zeros((2, 2), np.uint8)).save(tmp_path / "1.png")
    records = [record(1, "1.png")]
    features, captions = CaptionSet(records, FeatureFolder(tmp_path))[0]
    assert features.shape == (2, 3) and captions == [["a", "cat"]]
    pixels, _ = CaptionSet(records, ImageFolder(tmp_path, size=(2, 2)))[0]
    assert pixels.shape == (2, 2)
    assert len(CaptionSet(records, lambda r: np.zeros(r.id))) == 1
