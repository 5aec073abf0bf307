"""Image captions in the official formats: COCO annotation JSON, Karpathy's split file, a caption vocabulary,
and the images or pre-computed features they describe.

The formats read:

    captions_train2014.json   {"images": [{"id", "file_name", "height", "width"}, ...],
                               "annotations": [{"id", "image_id", "caption"}, ...]}     (Chen et al. 2015)
    dataset_coco.json         {"images": [{"filepath", "filename", "imgid", "split", "cocoid", "sentids",
                               "sentences": [{"tokens", "raw", "imgid", "sentid"}, ...]}, ...], "dataset": "coco"}
                              (Karpathy and Li 2015; split is "train", "val", "test" or "restval")

Both give :class:`CaptionedImage` records. A COCO caption is tokenised here (:func:`tokenize`, Karpathy's rule:
lower-case, split on every character that is not a letter or digit, empties dropped: "A t-shirt." -> ["a", "t",
"shirt"]; the COCO evaluation toolkit's PTB tokenizer, which scores against the raw captions, keeps "t-shirt"
whole); a Karpathy sentence keeps its own "tokens" (tokenised from "raw" only where it has none; its "raw", the
reference scored against, is its tokens joined by spaces where it has none). An image id given twice is an error
in both formats (captions and scores are kept by id). Karpathy's
"restval" images (the 30,504 COCO val2014 images in neither his val nor test) are read as "train", as in common
practice (neuraltalk2, self-critical.pytorch): training on train + restval is what the papers report, the
MSCOCO experiment of the Self-Adaptive Scaling paper among them (113,287 / 5,000 / 5,000 images).

:class:`Vocabulary`: the words of the training captions seen at least ``min_count`` times (default 5, the
paper's: rarer words become ``<unk>``), after the special tokens ``<pad>`` 0, ``<unk>`` 1, ``<bos>`` 2,
``<eos>`` 3; saved as JSON.

Images come from an :class:`ImageFolder` (files read with PIL, a record's "file_name" relative to the folder,
its size checked) or a :class:`FeatureFolder` (one array per image: ``<id>.npy``, or ``<id>.npz`` holding it
under the key ``"feat"`` (:data:`FEATURE_KEY`), or the same under the stem of the file name: the layout of
self-critical.pytorch's ``cocobu_fc/<cocoid>.npy`` and ``cocobu_att/<cocoid>.npz``, bottom-up-attention
region features of shape (regions, 2048)). :class:`CaptionSet` pairs records with either:
``caption_set[i]`` is (the image or its features, the image's captions as token lists).
Bad input is a one-line error naming the file.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

KARPATHY_SPLITS = ("train", "val", "test", "restval")
FEATURE_KEY = "feat"  # np.savez_compressed(f"{cocoid}.npz", feat=...), as self-critical.pytorch writes them
VOCAB_FORMAT = "skiplab-caption-vocab"
_WORD = re.compile(r"[^\W_]+")  # runs of letters and digits (any script); "_" is not alphanumeric


@dataclass(frozen=True)
class CaptionedImage:
    """One image and its captions, from either format."""

    id: int  # COCO's image id ("id"; Karpathy's "cocoid", or "imgid" where a file has no cocoid)
    file_name: str  # relative to the image folder (Karpathy's "filepath/filename")
    captions: list[list[str]]  # token lists, one per caption, in file order
    raw: list[str]  # the captions as written
    split: str | None = None  # Karpathy's split ("restval" read as "train"); None for a COCO file
    height: int | None = None  # from a COCO file; None where the file does not say
    width: int | None = None


def tokenize(caption: str) -> list[str]:
    """Karpathy's tokenisation: lower-case, split on non-alphanumeric characters, drop empty pieces."""
    return _WORD.findall(caption.lower())


def read_coco_captions(path: str | Path) -> list[CaptionedImage]:
    """The images of a COCO captions file, in its "images" order, each with its captions in annotation order.

    An image no annotation names has no captions; an annotation naming an image the file does not list is an
    error.
    """
    path = Path(path)
    data = _read_json(path)
    images, annotations = _list(data, "images", path), _list(data, "annotations", path)
    entries: dict[int, dict] = {}
    for i, image in enumerate(images):
        _need(image, {"id": int, "file_name": str}, path, f"images[{i}]")
        if image["id"] in entries:
            raise ValueError(f"{path}: images[{i}]: image id {image['id']} appears twice")
        entries[image["id"]] = image
    raw: dict[int, list[str]] = {i: [] for i in entries}
    for i, ann in enumerate(annotations):
        _need(ann, {"image_id": int, "caption": str}, path, f"annotations[{i}]")
        if ann["image_id"] not in raw:
            raise ValueError(f"{path}: annotations[{i}]: image_id {ann['image_id']} is not among the images")
        raw[ann["image_id"]].append(ann["caption"])
    return [
        CaptionedImage(i, e["file_name"], [tokenize(c) for c in raw[i]], raw[i],
                       height=e.get("height"), width=e.get("width"))
        for i, e in entries.items()
    ]


def read_karpathy(path: str | Path, split: str | None = None) -> list[CaptionedImage]:
    """The images of a Karpathy split file, in file order; only those of ``split`` ("train", restval included,
    "val" or "test") when given."""
    path = Path(path)
    if split is not None and split not in KARPATHY_SPLITS[:3]:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(KARPATHY_SPLITS[:3])}")
    out, seen = [], set()
    for i, image in enumerate(_list(_read_json(path), "images", path)):
        where = f"images[{i}]"
        _need(image, {"filename": str, "imgid": int, "split": str, "sentences": list}, path, where)
        key = image.get("cocoid", image["imgid"])
        if key in seen:  # captions and scores are kept by image id: a second image would replace the first
            raise ValueError(f"{path}: {where}: image id {key} appears twice")
        seen.add(key)
        if image["split"] not in KARPATHY_SPLITS:
            raise ValueError(f"{path}: {where}: unknown split {image['split']!r}; known: {', '.join(KARPATHY_SPLITS)}")
        found = "train" if image["split"] == "restval" else image["split"]
        if split is None or found == split:
            sentences = [_sentence(s, path, f"{where}.sentences[{j}]") for j, s in enumerate(image["sentences"])]
            file_name = str(Path(image.get("filepath", "")) / image["filename"])
            out.append(CaptionedImage(key, file_name,
                                      [t for t, _ in sentences], [r for _, r in sentences], found))
    return out


class Vocabulary:
    """Words to ids: the specials, then the kept words by falling count (ties in alphabetical order)."""

    PAD, UNK, BOS, EOS = 0, 1, 2, 3
    SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")

    def __init__(self, words: Sequence[str], min_count: int = 5) -> None:
        """``words``: every token in id order, the four specials first; use :meth:`build` or :meth:`load`."""
        if (not all(isinstance(w, str) for w in words) or tuple(words[:4]) != self.SPECIALS
                or len(set(words)) != len(words)):
            raise ValueError(f"a vocabulary starts with {', '.join(self.SPECIALS)} and has no word twice")
        self.words = list(words)
        self.min_count = min_count
        self._ids = {w: i for i, w in enumerate(self.words)}

    @classmethod
    def build(cls, captions: Iterable[Sequence[str]], min_count: int = 5) -> Vocabulary:
        """From training captions (token lists): the words seen at least ``min_count`` times."""
        if min_count < 1:
            raise ValueError(f"min_count must be at least 1, got {min_count}")
        counts = Counter(t for caption in captions for t in caption)
        kept = sorted((w for w, n in counts.items() if n >= min_count and w not in cls.SPECIALS),
                      key=lambda w: (-counts[w], w))
        return cls([*cls.SPECIALS, *kept], min_count)

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: str) -> bool:
        return word in self._ids

    def encode(self, tokens: Iterable[str], bos_eos: bool = True) -> list[int]:
        """The ids of ``tokens`` (``<unk>`` for a word not kept), between ``<bos>`` and ``<eos>`` unless told not."""
        ids = [self._ids.get(t, self.UNK) for t in tokens]
        return [self.BOS, *ids, self.EOS] if bos_eos else ids

    def tokens(self, ids: Iterable[int]) -> list[str]:
        """The words of ``ids`` (a list or a 1-D tensor) up to the first ``<eos>``; ``<pad>`` and ``<bos>``
        skipped, ``<unk>`` kept."""
        out = []
        for i in map(int, ids):
            if i == self.EOS:
                break
            if not 0 <= i < len(self.words):
                raise ValueError(f"id {i} is out of range for a vocabulary of {len(self.words)}")
            if i not in (self.PAD, self.BOS):
                out.append(self.words[i])
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """:meth:`tokens` joined by spaces: the caption as the evaluation toolkits take it."""
        return " ".join(self.tokens(ids))

    def save(self, path: str | Path) -> None:
        """Write ``{"format", "min_count", "words"}`` as JSON; an existing file is not overwritten."""
        path = Path(path)
        if path.exists():
            raise FileExistsError(f"{path}: already exists; refusing to overwrite it")
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"format": VOCAB_FORMAT, "min_count": self.min_count, "words": self.words}
        path.write_text(json.dumps(data, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        """Read what :meth:`save` wrote."""
        path = Path(path)
        data = _read_json(path)
        if not isinstance(data, dict) or data.get("format") != VOCAB_FORMAT or not isinstance(data.get("words"), list):
            raise ValueError(f"{path}: not a caption vocabulary (no \"format\": \"{VOCAB_FORMAT}\" with \"words\")")
        try:
            return cls(data["words"], data.get("min_count", 5))
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    def to_bytes(self) -> bytes:
        """What :meth:`save` writes, as bytes (a caption run's checkpoints hold it)."""
        data = {"format": VOCAB_FORMAT, "min_count": self.min_count, "words": self.words}
        return json.dumps(data, ensure_ascii=False).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes) -> Vocabulary:
        """The inverse of :meth:`to_bytes`."""
        obj = json.loads(data.decode("utf-8"))
        if not isinstance(obj, dict) or obj.get("format") != VOCAB_FORMAT:
            raise ValueError(f"not a caption vocabulary (no \"format\": \"{VOCAB_FORMAT}\")")
        return cls(obj["words"], obj.get("min_count", 5))

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} words, min_count={self.min_count})"


class ImageFolder:
    """Images read with PIL from ``root``: ``folder[record]`` is a uint8 array (H, W) or (H, W, C).

    The size checked is ``size`` (height, width) when given, else the record's own (a COCO file states it).
    ``mode`` converts (e.g. "RGB": COCO holds a few grey images); None keeps the file's. ``channels``, where given,
    is checked too: the image's bands once read (after ``mode``), 1 for a grey one. :meth:`check` reads a file's
    header alone, so that every image of a set can be checked before a run writes anything.
    """

    def __init__(self, root: str | Path, size: tuple[int, int] | None = None, mode: str | None = None,
                 channels: int | None = None) -> None:
        self.root, self.size, self.mode, self.channels = Path(root), size, mode, channels

    def _size(self, record: CaptionedImage) -> tuple[int, int] | None:
        return self.size or (None if record.height is None else (record.height, record.width))

    def __getitem__(self, record: CaptionedImage) -> np.ndarray:
        return read_image(self.root / record.file_name, self._size(record), self.mode, self.channels)

    def check(self, record: CaptionedImage) -> Path:
        """``record``'s file, its header and its last bytes read (not its pixels): a one-line error naming it
        where it is missing, not an image, cut short, or not of the size and channels :meth:`__getitem__` checks.

        Cut short: a PNG must end with its IEND chunk (00 00 00 00 "IEND" AE 42 60 82), a JPEG with its EOI
        marker (FF D9), either followed by nothing but zero bytes (padding); other formats are not checked for
        it. A file that does not end so is decoded whole, and kept where that succeeds (a trailer another program
        appended, or a PNG whose pixels are all there but not its IEND: what :meth:`__getitem__` reads too);
        where it fails the file is refused. The decode is for those rare files alone, so that checking a set of
        COCO's size stays a matter of headers."""
        from PIL import Image, UnidentifiedImageError

        path = _file(self.root / record.file_name)
        cut = _cut_short(path)
        try:
            with Image.open(path) as image:
                shape, mode = (image.height, image.width), self.mode or image.mode
                bands = Image.getmodebands(mode)
                if cut:
                    image.load()
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            why = " ".join(str(exc).split())
            raise ValueError(f"{path}: not a readable image ({f'{cut}; {why}' if cut else why})") from None
        _check_image(path, shape, bands, mode, self._size(record), self.channels)
        return path


def read_image(path: str | Path, size: tuple[int, int] | None = None, mode: str | None = None,
               channels: int | None = None) -> np.ndarray:
    """One image file as uint8 (H, W) or (H, W, C); its (height, width) must be ``size`` and its channels (after
    ``mode``; 1 for (H, W)) ``channels`` where given."""
    from PIL import Image, UnidentifiedImageError

    path = _file(Path(path))
    try:
        with Image.open(path) as image:
            shown = image.convert(mode) if mode else image
            array, mode = np.asarray(shown), shown.mode
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"{path}: not a readable image ({' '.join(str(exc).split())})") from None
    _check_image(path, array.shape[:2], 1 if array.ndim == 2 else array.shape[2], mode, size, channels)
    return array


PNG_SIGNATURE, PNG_END = b"\x89PNG\r\n\x1a\n", b"\x00\x00\x00\x00IEND\xaeB`\x82"
JPEG_START, JPEG_END = b"\xff\xd8", b"\xff\xd9"


def _cut_short(path: Path, tail: int = 1024) -> str | None:
    """Why the PNG or JPEG file ``path`` looks cut short (it does not end with its IEND chunk or EOI marker, zero
    bytes after it allowed), or None: from its first and last bytes alone (:meth:`ImageFolder.check`)."""
    with open(path, "rb") as f:
        head = f.read(len(PNG_SIGNATURE))
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - tail))
        end = f.read().rstrip(b"\x00")
    if head.startswith(PNG_SIGNATURE) and not end.endswith(PNG_END):
        return "a PNG cut short: it does not end with an IEND chunk"
    if head.startswith(JPEG_START) and not end.endswith(JPEG_END):
        return "a JPEG cut short: it does not end with an EOI marker (FF D9)"
    return None


def _file(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    return path


def _check_image(path: Path, shape: tuple[int, ...], bands: int, mode: str, size: tuple[int, int] | None,
                 channels: int | None) -> None:
    """A one-line error naming ``path`` where its (height, width) is not ``size`` or its bands not ``channels``."""
    if size is not None and tuple(shape) != tuple(size):
        raise ValueError(f"{path}: image of {shape[0]}x{shape[1]} (height x width), expected {size[0]}x{size[1]}")
    if channels is not None and bands != channels:
        found = "a grey image (1 channel)" if bands == 1 else f"an {mode} image ({bands} channels)"
        kind = {1: " (grey)", 3: " (RGB)"}.get(channels, "")
        raise ValueError(f"{path}: {found}, expected {channels} channel{'s' if channels > 1 else ''}{kind}")


class FeatureFolder:
    """Pre-computed features, one file per image in ``root``: ``folder[record]`` is its array.

    Looked for in order: ``<id>.npy``, ``<id>.npz``, ``<stem>.npy``, ``<stem>.npz`` (stem: the file name
    without folder or extension); an .npz holds the array under ``key`` (default :data:`FEATURE_KEY`).
    Every array must have shape ``shape``, where None marks a free axis (``(None, 2048)`` for a varying
    number of regions); without ``shape``, the first array read fixes it for the others.
    """

    def __init__(self, root: str | Path, shape: tuple[int | None, ...] | None = None, key: str = FEATURE_KEY) -> None:
        self.root, self.shape, self.key = Path(root), shape, key

    def path(self, record: CaptionedImage) -> Path:
        """The file holding ``record``'s features; FileNotFoundError naming the first name tried when none."""
        stem = Path(record.file_name).stem
        names = [f"{record.id}.npy", f"{record.id}.npz", f"{stem}.npy", f"{stem}.npz"]
        found = next((self.root / n for n in names if (self.root / n).is_file()), None)
        if found is None:
            raise FileNotFoundError(f"{self.root / names[0]}: no such file (nor {', '.join(names[1:])})")
        return found

    def __getitem__(self, record: CaptionedImage) -> np.ndarray:
        path = self.path(record)
        array = _load_array(path, self.key)
        self._check(path, array.shape, array.dtype)
        return array

    def check(self, record: CaptionedImage) -> Path:
        """``record``'s file, its array's header read (not its values): a one-line error naming it where it is
        missing, not an array file, or not of the shape (and a floating-point type) :meth:`__getitem__` checks."""
        path = self.path(record)
        self._check(path, *_array_header(path, self.key))
        return path

    def _check(self, path: Path, shape: tuple[int, ...], dtype: np.dtype) -> None:
        if self.shape is None:
            self.shape = tuple(shape)
        expected = tuple(self.shape)
        if len(shape) != len(expected) or any(e is not None and e != n for e, n in zip(expected, shape)):
            shown = "(" + ", ".join("*" if e is None else str(e) for e in expected) + ")"
            raise ValueError(f"{path}: features of shape {tuple(shape)}, expected {shown}")
        if not np.issubdtype(dtype, np.floating):
            raise ValueError(f"{path}: features of type {dtype}, expected floating-point values")


Source = ImageFolder | FeatureFolder | Callable[[CaptionedImage], np.ndarray]


class CaptionSet:
    """``records`` with their pixels or features: ``caption_set[i]`` is (``source[records[i]]``, the token lists);
    ``source`` is an :class:`ImageFolder`, a :class:`FeatureFolder` or a function of a record."""

    def __init__(self, records: Sequence[CaptionedImage], source: Source) -> None:
        self.records = list(records)
        self.source = source

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> tuple[np.ndarray, list[list[str]]]:
        record = self.records[i]
        load = self.source if callable(self.source) else self.source.__getitem__
        return load(record), record.captions


def _load_array(path: Path, key: str) -> np.ndarray:
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a NumPy array file ({' '.join(str(exc).split())})") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        return loaded
    with loaded:
        if key not in loaded.files:
            raise ValueError(f"{path}: no array named {key!r} (found: {', '.join(loaded.files) or 'none'})")
        return loaded[key]


def _array_header(path: Path, key: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of the array of an .npy file, or the one named ``key`` in an .npz, from its header alone."""
    import zipfile

    def header(f) -> tuple[tuple[int, ...], np.dtype]:
        version = np.lib.format.read_magic(f)
        shape, _, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                           else np.lib.format.read_array_header_2_0(f))
        if dtype.hasobject:
            raise ValueError("it holds Python objects")
        return shape, dtype

    names: list[str] = []
    try:
        if not zipfile.is_zipfile(path):
            with open(path, "rb") as f:
                return header(f)
        with zipfile.ZipFile(path) as z:
            names = [n.removesuffix(".npy") for n in z.namelist()]
            if key not in names:
                raise KeyError(key)
            with z.open(f"{key}.npy") as f:
                return header(f)
    except KeyError:
        raise ValueError(f"{path}: no array named {key!r} (found: {', '.join(names) or 'none'})") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path}: not a NumPy array file ({' '.join(str(exc).split())})") from None


def _read_json(path: Path) -> object:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({' '.join(str(exc).split())})") from None


def _list(data: object, key: str, path: Path) -> list:
    if not isinstance(data, dict) or not isinstance(data.get(key), list):
        raise ValueError(f"{path}: no {key!r} list at the top level")
    return data[key]


def _need(entry: object, fields: dict[str, type], path: Path, where: str) -> None:
    """``entry`` is an object whose ``fields`` have their types (bool is not an int here)."""
    if not isinstance(entry, dict):
        raise ValueError(f"{path}: {where} is not an object")
    for name, kind in fields.items():
        value = entry.get(name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"{path}: {where} has no {kind.__name__} {name!r}")


def _sentence(sentence: object, path: Path, where: str) -> tuple[list[str], str]:
    """(tokens, raw) of a Karpathy sentence; tokens from raw where the file gives none, raw the tokens joined by
    spaces where it gives none (the reference the scores read: it was an empty one)."""
    if not isinstance(sentence, dict) or not isinstance(sentence.get("raw", ""), str):
        raise ValueError(f"{path}: {where} is not an object with a \"raw\" string")
    raw, tokens = sentence.get("raw", ""), sentence.get("tokens")
    if tokens is None:
        if "raw" not in sentence:
            raise ValueError(f"{path}: {where} has neither \"tokens\" nor \"raw\"")
        return tokenize(raw), raw
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise ValueError(f"{path}: {where}: \"tokens\" is not a list of strings")
    return tokens, raw if "raw" in sentence else " ".join(tokens)
