"""Image captioning with any connection: the translation recipe and loop (skiplab.train.mt) over images.

A caption run is a translation run whose source side is an image: the same Adam (0.9, 0.98), inverse-square-root
schedule after a warm-up, label-smoothed cross-entropy per target word, checkpoints every ``save_every`` updates for
averaging and the same loop (:func:`skiplab.train.mt.train_seq2seq`); only the data differ (:class:`CaptionSource`).
Every (image, caption) pair of the training split is an example (five per COCO image), ``batch_size`` pairs a
batch, in an order drawn from the run's seed each epoch; captions are cut to ``max_caption_len`` words (16, as
self-critical.pytorch's prepro_labels.py does); the vocabulary is the training captions' words seen at least
``min_count`` times (5, the SAS paper's), stored in every checkpoint.

**Self-critical sequence training** (Rennie et al. 2017), an optional second stage: ``scst_from`` names a finished
cross-entropy run whose weights (and vocabulary) the run starts from, of the same model, dataset (captions file)
and ``max_caption_len`` (:func:`check_scst_source`); every batch is ``batch_size`` training images,
each with ``scst_samples`` captions drawn from the model and its greedy caption as the baseline, and the loss is

    L = -(1 / (B·K)) Σ_b Σ_k (r(w^{b,k}) - r(ŵ^b)) Σ_t log p(w^{b,k}_t | w^{b,k}_<t, I_b)

with r the CIDEr-D of a caption against the image's references, document frequencies from the training
references (skiplab.interop.coco_eval.CiderD), ŵ the greedy caption; the sampled words' log-probabilities come
from one teacher-forced pass over the samples. Sampling, the baseline and that pass use the model without dropout
(BatchNorm with its running statistics), so the gradient is of the policy that sampled. The usual recipe: a
constant learning rate of 5e-6 (``--schedule constant --lr 5e-6 --warmup 0``); validation keeps the cross-entropy.
Cross-entropy training alone is the default.

The data, by ``dataset``:

- ``fashion-mnist-scenes``: scenes composed from Fashion-MNIST (:mod:`skiplab.data.scenes`; ``data_dir`` holds the
  Fashion-MNIST IDX files, found where the image task finds them when empty), ``train_scenes`` / ``valid_scenes``
  / ``test_scenes`` of them, composed with ``scene_seed`` (the same scenes for every run of every seed).
- ``fashion-mnist-scenes-hard``: its harder variant (:mod:`skiplab.data.scenes_hard`: a 3x3 grid of up to six
  garments of two sizes and two tones, counts to six, relations among garments told apart from their distractors),
  read the same way.
- ``fashion-mnist-scenes-crowded``: another (:mod:`skiplab.data.scenes_crowded`: the same grid with up to eight
  garments of two or three kinds a scene, smaller and darker, and short where captions), read the same way.
- ``''`` (files): ``captions``, Karpathy's split file (``dataset_coco.json``: train + restval, val, test) or a COCO
  captions file (``captions_train2014.json`` style; then ``valid_captions`` and ``test_captions`` name the other
  splits' files), with the images in ``image_dir`` (each of ``image_size`` pixels a side, of the model's
  ``channels``: a model of 3 reads COCO's few grey images widened to RGB, a model of 1 refuses a colour image;
  :class:`~skiplab.data.captions.ImageFolder`) or their features in ``feature_dir`` (one ``.npy`` / ``.npz`` per
  image, floating-point (regions, ``feature_dim``); the model's ``input`` must be ``features``). Every file's
  header (and an image's end: :meth:`~skiplab.data.captions.ImageFolder.check`) is checked before a run writes
  anything, the test split's too where the data name one (:func:`names_test_files`). A relative path among these
  is inside ``data_dir`` where one is given (how ``reproduce`` finds COCO under its ``--data-root``).
"""

from __future__ import annotations

import dataclasses
import filecmp
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import decoding, distributed, run_dir
from ..data import idx
from ..data.images import SYSTEM_FASHION_MNIST, dataset_dirs
from ..data.scenes import fashion_scenes
from ..data.scenes_crowded import crowded_fashion_scenes
from ..data.scenes_hard import hard_fashion_scenes
from ..interop.coco_eval import CiderD
from ..models import CaptionerConfig, caption_families, family_of, model_config
from ..data.captions import CaptionedImage, FeatureFolder, ImageFolder, Vocabulary, read_coco_captions, \
    read_karpathy, tokenize
from .mt import Seq2SeqData, Seq2SeqRecipe, train_seq2seq
from .run import Run

SCENE_SETS = {"fashion-mnist-scenes": fashion_scenes, "fashion-mnist-scenes-hard": hard_fashion_scenes,
              "fashion-mnist-scenes-crowded": crowded_fashion_scenes}
DATASETS = (*SCENE_SETS, "")
SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class CaptionTrainConfig(Seq2SeqRecipe):
    """Everything that decides a captioning run; saved as config.json beside its results."""

    model: str = field(default="captioner-small", metadata={
        "help": "model spec: a captioner preset, optionally with options, e.g. captioner-small(connection=SAS) or "
                "captioner-small(encoder_connection=PostLN,decoder_connection=2rSkip+LN)"})
    dataset: str = field(default="fashion-mnist-scenes", metadata={
        "help": "fashion-mnist-scenes (composed from Fashion-MNIST), fashion-mnist-scenes-hard and "
                "fashion-mnist-scenes-crowded (its harder variants), or '' for --captions files"})
    data_dir: str = field(default="", metadata={
        "help": "fashion-mnist-scenes: the Fashion-MNIST IDX files ('' = where the image task finds them); files: "
                "the folder relative --captions, --image-dir and --feature-dir are in"})
    scene_seed: int = field(default=0, metadata={"help": "fashion-mnist-scenes: the seed composing the scenes"})
    train_scenes: int = field(default=12000, metadata={"min": 1, "help": "fashion-mnist-scenes: training scenes"})
    valid_scenes: int = field(default=1000, metadata={"min": 1, "help": "fashion-mnist-scenes: validation scenes"})
    test_scenes: int = field(default=1000, metadata={"min": 1, "help": "fashion-mnist-scenes: test scenes"})
    captions: str = field(default="", metadata={
        "help": "with --dataset '': Karpathy's split file (dataset_coco.json) or a COCO captions file for training"})
    valid_captions: str = field(default="", metadata={"help": "with a COCO --captions file: the validation split's"})
    test_captions: str = field(default="", metadata={"help": "with a COCO --captions file: the test split's"})
    image_dir: str = field(default="", metadata={"help": "with --dataset '': the folder of the images"})
    feature_dir: str = field(default="", metadata={
        "help": "with --dataset '': a folder of precomputed features, <id>.npy or .npz (model input=features)"})
    min_count: int = field(default=5, metadata={"min": 1, "help": "words seen fewer times in training become <unk>"})
    max_caption_len: int = field(default=16, metadata={"min": 1, "help": "captions are cut to this many words"})
    batch_size: int = field(default=50, metadata={
        "min": 1, "help": "(image, caption) pairs per batch; with --scst-from, images per batch"})
    scst_from: str = field(default="", metadata={
        "help": "self-critical training from this cross-entropy caption run (its directory or a .pt file); "
                "'' = cross-entropy training"})
    scst_samples: int = field(default=5, metadata={"min": 1, "help": "self-critical: captions sampled per image"})
    lr: float = field(default=5e-4, metadata={"help": "peak learning rate, reached at the end of warm-up"})
    warmup: int = field(default=1000, metadata={"min": 0, "help": "linear warm-up steps"})
    save_every: int = field(default=500, metadata={"min": 1, "help": "validate and save a checkpoint every N updates"})
    out: str = field(default="runs/caption", metadata={"help": "run directory"})

    def __post_init__(self):
        super().__post_init__()
        if self.dataset not in DATASETS:
            raise ValueError(f"unknown dataset {self.dataset!r}; known: {', '.join(SCENE_SETS)}, or '' for files")
        if family_of(self.model) not in caption_families():
            raise ValueError(f"{self.model} is not a captioning model; known: captioner-small, captioner-base")
        mcfg = self.model_config(10)  # a bad spec or option fails here, before anything is written
        if self.dataset == "":
            if not self.captions:
                raise ValueError("with --dataset '' give --captions (a Karpathy split file or a COCO captions file)")
            if bool(self.image_dir) == bool(self.feature_dir):
                raise ValueError("with --dataset '' give exactly one of --image-dir and --feature-dir")
            if self.feature_dir and mcfg.input != "features":
                raise ValueError(f"--feature-dir needs a model reading features (input=features); {self.model} "
                                 f"reads {mcfg.input}")
            if self.image_dir and mcfg.input != "pixels":
                raise ValueError(f"--image-dir needs a model reading pixels (input=pixels); {self.model} reads "
                                 f"{mcfg.input}")
        elif mcfg.input != "pixels" or mcfg.channels != 1 or mcfg.image_size != 64:
            raise ValueError(f"{self.dataset} are 64 x 64 grey images: the model needs input=pixels, channels=1, "
                             f"image_size=64 ({self.model} has {mcfg.input}, {mcfg.channels}, {mcfg.image_size})")

    def model_config(self, vocab_size: int) -> CaptionerConfig:
        """The model's config, resolved from the spec, for a vocabulary of ``vocab_size`` words."""
        return model_config(self.model, vocab_size=vocab_size, pad_id=Vocabulary.PAD)


@dataclass
class Split:
    """A split's images (or how to load one) and their captions."""

    name: str
    ids: list[int]  # image ids (the scene's index for fashion-mnist-scenes)
    raw: list[list[str]]  # every image's captions as written (what the metrics score against)
    tokens: list[list[list[str]]]  # the same, tokenised
    load: Any  # index -> uint8 image array (H, W) / (H, W, C), or features (N, F)
    files: Any = None  # index -> the file ``load`` reads, its header checked (None: in memory)

    def __len__(self) -> int:
        return len(self.ids)

    def check(self) -> None:
        """Every image's file is there and its header says what the model takes (an image's size and channels,
        features' width and type), and the first one loads: a one-line error naming the file otherwise, before a
        run writes anything."""
        if self.files is not None:
            for i in range(len(self)):
                self.files(i)
        if len(self):
            self.load(0)


def load_split(cfg: CaptionTrainConfig | dict[str, Any], split: str) -> Split:
    """The images and captions of ``split`` (train, valid, test) as ``cfg`` (a config or its dict) names them."""
    c = cfg if isinstance(cfg, dict) else dataclasses.asdict(cfg)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    if c["dataset"] in SCENE_SETS:
        n = c[f"{split}_scenes"]
        compose = SCENE_SETS[c["dataset"]]
        scenes = compose(fashion_dir(c["data_dir"]), "val" if split == "valid" else split, n, c["scene_seed"])
        pixels = scenes.pixels
        return Split(f"{c['dataset']} {split} ({n} scenes, seed {c['scene_seed']})", list(range(n)), scenes.captions,
                     [[tokenize(t) for t in caps] for caps in scenes.captions], lambda i: pixels[i])
    records, source = _records(c, split)
    mcfg = model_config(c["model"], vocab_size=10)
    if c["feature_dir"]:  # any number of regions, each of the model's width
        features = FeatureFolder(data_path(c, "feature_dir"), shape=(None, mcfg.feature_dim))
        load, files = (lambda i: features[records[i]]), (lambda i: features.check(records[i]))
    else:  # a colour model widens grey images (COCO holds a few); a grey model refuses colour ones
        size = mcfg.image_size
        images = ImageFolder(data_path(c, "image_dir"), size=(size, size), mode="RGB" if mcfg.channels == 3 else None,
                             channels=mcfg.channels)
        load, files = (lambda i: images[records[i]]), (lambda i: images.check(records[i]))
    name = f"{source.name} {split} ({len(records)} images)"  # no folder: the same wherever it lies
    return Split(name, [r.id for r in records], [r.raw for r in records], [r.captions for r in records], load, files)


def names_test_files(cfg: CaptionTrainConfig | dict[str, Any]) -> bool:
    """Whether ``cfg``'s data name a test split of files, checked with the others when a run starts: a files run's
    Karpathy file (its test images, which may be none) or a COCO captions file with ``test_captions`` (a run
    without one trains all the same); a scene set is composed in memory, with no file to check."""
    c = cfg if isinstance(cfg, dict) else dataclasses.asdict(cfg)
    return c["dataset"] == "" and bool(c["test_captions"] or not _is_coco(Path(data_path(c, "captions"))))


def check_scst_source(cfg: CaptionTrainConfig, start: dict[str, Any]) -> None:
    """A one-line error where the run ``cfg.scst_from`` (its checkpoint ``start``) is not one a self-critical
    stage can start from as ``cfg`` says: another model, another dataset (for files, another ``captions`` file:
    neither the same path nor a copy of the same bytes; for a composed scene set, another seed or size: its
    vocabulary would be reused for data it never saw), another ``min_count`` (the vocabulary is the source's) or
    another ``max_caption_len`` (a mismatch is refused, not inherited, so that config.json says what the run did)."""
    theirs = start["config"]
    vocab = Vocabulary.from_bytes(start["tokenizer"])
    where = f"--scst-from {cfg.scst_from}"
    if start["model_config"] != dataclasses.asdict(cfg.model_config(len(vocab))):
        raise ValueError(f"{where} trained {theirs['model']}, this run names {cfg.model}: give the same model")
    ours = dataclasses.asdict(cfg)
    if theirs.get("dataset") != cfg.dataset:
        raise ValueError(f"{where} trained on --dataset {theirs.get('dataset') or repr('')}, this run names "
                         f"--dataset {cfg.dataset or repr('')}: give the same dataset")
    if cfg.dataset == "":
        a, b = Path(data_path(theirs, "captions")), Path(data_path(ours, "captions"))
        same = a.resolve() == b.resolve() or (a.is_file() and b.is_file() and filecmp.cmp(a, b, shallow=False))
        if not same:
            raise ValueError(f"{where} trained on --captions {a}, this run names --captions {b}: give the same "
                             f"captions file")
    if theirs.get("max_caption_len") != cfg.max_caption_len:
        raise ValueError(f"{where} trained with --max-caption-len {theirs.get('max_caption_len')}, this run has "
                         f"{cfg.max_caption_len}: give --max-caption-len {theirs.get('max_caption_len')}")
    scenes = ("scene_seed", "train_scenes", "valid_scenes", "test_scenes") if cfg.dataset else ()
    for key in (*scenes, "min_count"):  # the same scenes; the vocabulary built with the same threshold
        if key in theirs and theirs[key] != ours[key]:
            flag = f"--{key.replace('_', '-')}"
            raise ValueError(f"{where} trained with {flag} {theirs[key]}, this run has {ours[key]}: give {flag} "
                             f"{theirs[key]}")


def data_path(c: dict[str, Any], key: str) -> str:
    """The file or folder ``c[key]`` names: inside ``c["data_dir"]`` where it is relative and a data_dir is given."""
    value = c[key]
    if value and c["data_dir"] and not Path(value).is_absolute():
        return str(Path(c["data_dir"]) / value)
    return value


def _records(c: dict[str, Any], split: str) -> tuple[list[CaptionedImage], Path]:
    """A split's records from Karpathy's file (its splits) or the COCO captions file named for the split, and
    that file. An image without captions is left out, in either format: nothing to learn from or score against."""
    path = Path(data_path(c, "captions"))
    if _is_coco(path):
        files = {"train": "captions", "valid": "valid_captions", "test": "test_captions"}
        if not c[files[split]]:
            raise ValueError(f"{path} is a COCO captions file: give --{split}-captions for the {split} split")
        source = Path(data_path(c, files[split]))
        return [r for r in read_coco_captions(source) if r.captions], source
    given = [f"--{k.replace('_', '-')}" for k in ("valid_captions", "test_captions") if c.get(k)]
    if given:
        read_karpathy(path, "train")  # a missing, unreadable or misshapen file: its reader's error, naming it
        raise ValueError(f"{path} is a Karpathy split file, which holds every split itself: {' and '.join(given)} "
                         "name a COCO file's other splits; leave them out")
    return [r for r in read_karpathy(path, "val" if split == "valid" else split) if r.captions], path


def _is_coco(path: Path) -> bool:
    """Whether ``path`` holds a COCO captions file rather than Karpathy's: a top-level "annotations", or images
    listed COCO's way (a "file_name", where Karpathy's have a "filename"), so that a COCO file without its
    annotations is told so by the COCO reader. A file that is missing or not JSON is left to the Karpathy reader,
    whose error names it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    if not isinstance(data, dict):
        return False
    images = data.get("images")
    first = images[0] if isinstance(images, list) and images else None
    return "annotations" in data or (isinstance(first, dict) and "file_name" in first and "filename" not in first)


def fashion_dir(data_dir: str) -> Path:
    """The folder of the Fashion-MNIST IDX files: ``data_dir``, else the first of the image task's places that has
    them; a one-line error saying how to install them where none has."""
    candidates = [Path(data_dir)] if data_dir else dataset_dirs("fashion-mnist")
    for root in candidates:
        if all(idx.find_idx_file(root, n) is not None for n in idx.IDX_FILES["train"]):
            return root
    where = ", ".join(str(p) for p in candidates)
    if data_dir:
        raise FileNotFoundError(f"no Fashion-MNIST IDX files in --data-dir {data_dir} (`apt-get install "
                                f"dataset-fashion-mnist` puts them in {SYSTEM_FASHION_MNIST})")
    raise FileNotFoundError(f"no Fashion-MNIST IDX files in {where}: run `apt-get install dataset-fashion-mnist` "
                            f"or give --data-dir")


def teacher_forcing(sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoder's inputs and targets of id sequences that start with BOS, right-padded with PAD: sequence
    [BOS, w1, ..., wn(, EOS)] gives the input [BOS, w1, ..., wn-1(, wn)] and the target [w1, ..., wn(, EOS)]."""
    width = max(len(t) for t in sequences) - 1
    tgt_in = torch.full((len(sequences), width), Vocabulary.PAD, dtype=torch.long)
    tgt_out = torch.full((len(sequences), width), Vocabulary.PAD, dtype=torch.long)
    for k, t in enumerate(sequences):
        tgt_in[k, : len(t) - 1] = torch.tensor(t[:-1], dtype=torch.long)
        tgt_out[k, : len(t) - 1] = torch.tensor(t[1:], dtype=torch.long)
    return tgt_in, tgt_out


class CaptionBatch:
    """``batch_size`` (image, caption) pairs: images stacked on :meth:`to`, captions as id tensors."""

    def __init__(self, split: Split, pairs: list[tuple[int, int]], captions: list[list[list[int]]]):
        self.split, self.pairs = split, pairs
        self.tgt_in, self.tgt_out = teacher_forcing([captions[i][j] for i, j in pairs])  # each BOS + words + EOS
        self.ntokens = int((self.tgt_out != Vocabulary.PAD).sum())
        self.src: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.pairs)

    def to(self, device: torch.device | str) -> CaptionBatch:
        """The batch with its images loaded and every tensor on ``device``."""
        out = CaptionBatch.__new__(CaptionBatch)
        out.split, out.pairs, out.ntokens = self.split, self.pairs, self.ntokens
        out.src = stack_sources([self.split.load(i) for i, _ in self.pairs]).to(device)
        out.tgt_in, out.tgt_out = self.tgt_in.to(device), self.tgt_out.to(device)
        return out


def stack_sources(arrays: list[np.ndarray]) -> torch.Tensor:
    """Images (H, W) / (H, W, C) uint8 -> (B, C, H, W) uint8; features (N, F) -> (B, max N, F) float, zero-padded
    (the model masks all-zero rows)."""
    first = arrays[0]
    if first.dtype == np.uint8:
        x = torch.from_numpy(np.stack(arrays))
        return x[:, None] if x.dim() == 3 else x.permute(0, 3, 1, 2).contiguous()
    n = max(a.shape[0] for a in arrays)
    out = torch.zeros(len(arrays), n, first.shape[1])
    for k, a in enumerate(arrays):
        out[k, : a.shape[0]] = torch.from_numpy(np.asarray(a, dtype=np.float32))
    return out


def encode_captions(vocab: Vocabulary, split: Split, max_len: int) -> list[list[list[int]]]:
    """Every caption of every image as BOS + its first ``max_len`` words' ids + EOS."""
    return [[vocab.encode(t[:max_len]) for t in caps] for caps in split.tokens]


def pair_batches(split: Split, captions: list[list[list[int]]], batch_size: int, shuffle: bool = False,
                 generator: torch.Generator | None = None) -> list[CaptionBatch]:
    """Every (image, caption) pair of ``split`` in batches of ``batch_size``, in file order or shuffled."""
    pairs = [(i, j) for i, caps in enumerate(captions) for j in range(len(caps))]
    if shuffle:
        pairs = [pairs[k] for k in torch.randperm(len(pairs), generator=generator).tolist()]
    return [CaptionBatch(split, pairs[k:k + batch_size], captions) for k in range(0, len(pairs), batch_size)]


class ImageBatch:
    """``batch_size`` training images for self-critical training: their references and, on :meth:`to`, pixels."""

    def __init__(self, split: Split, images: list[int], samples: int):
        self.split, self.images, self.samples = split, images, samples
        self.ntokens = len(images) * samples  # the loss is a sum over the samples: normalised per sample
        self.src: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.images)

    def to(self, device: torch.device | str) -> ImageBatch:
        out = ImageBatch(self.split, self.images, self.samples)
        out.src = stack_sources([self.split.load(i) for i in self.images]).to(device)
        return out


def image_batches(split: Split, batch_size: int, samples: int, shuffle: bool = False,
                  generator: torch.Generator | None = None) -> list[ImageBatch]:
    order = torch.randperm(len(split), generator=generator).tolist() if shuffle else list(range(len(split)))
    return [ImageBatch(split, order[k:k + batch_size], samples) for k in range(0, len(order), batch_size)]


class SelfCritical:
    """The self-critical loss of a batch of images (module docstring): K sampled captions per image rewarded by
    CIDEr-D against the image's references, less the greedy caption's."""

    def __init__(self, vocab: Vocabulary, split: Split, samples: int, max_len: int, seed: int):
        self.vocab, self.samples, self.max_len = vocab, samples, max_len
        self.references = [[" ".join(t) for t in caps] for caps in split.tokens]
        self.cider = CiderD(self.references)
        self.generator = torch.Generator().manual_seed(seed)

    def rewards(self, captions: list[list[int]], images: list[int], per_image: int) -> list[float]:
        """CIDEr-D of each caption (ids) against its image's references; ``per_image`` captions an image."""
        return [self.cider.sentence(self.vocab.decode(c), self.references[images[k // per_image]])
                for k, c in enumerate(captions)]

    def __call__(self, train_net: Any, model: Any, batch: ImageBatch) -> torch.Tensor:
        was_training = model.training
        model.eval()  # the policy that samples is the one whose log-probabilities are differentiated
        try:
            greedy = decoding.greedy_search(model, batch.src, 0, self.max_len)
            sampled, ended = decoding.sample_search(model, batch.src, self.samples, self.max_len, self.generator)
            baseline = self.rewards(greedy, batch.images, 1)
            gain = torch.tensor([r - baseline[k // self.samples]
                                 for k, r in enumerate(self.rewards(sampled, batch.images, self.samples))])
            # a caption cut at max_len has no EOS to score
            tgt_in, tgt_out = teacher_forcing([[Vocabulary.BOS, *t, *([Vocabulary.EOS] if eos else [])]
                                               for t, eos in zip(sampled, ended)])
            device = batch.src.device
            src = batch.src.repeat_interleave(self.samples, dim=0)
            logits = train_net(src, tgt_in.to(device)).float()
            logp = torch.log_softmax(logits, dim=-1).gather(2, tgt_out.to(device)[..., None]).squeeze(2)
            logp = (logp * (tgt_out.to(device) != Vocabulary.PAD)).sum(1)
            return -(gain.to(device) * logp).sum()
        finally:
            model.train(was_training)


class CaptionSource:
    """The captioning task's :class:`~skiplab.train.mt.Seq2SeqData`: images (or features) and their captions."""

    def __init__(self, cfg: CaptionTrainConfig, group: distributed.Group):
        self.cfg = cfg
        if cfg.scst_from:  # read before anything is written: a bad run is one line
            self.start = run_dir.load_checkpoint(cfg.scst_from, kind="caption")
            check_scst_source(cfg, self.start)
        self.train, self.valid = group.main_first(lambda: (load_split(cfg, "train"), load_split(cfg, "valid")))
        if not len(self.train) or not len(self.valid):
            raise ValueError(f"no captioned images in the {'training' if not len(self.train) else 'validation'} split")

        def check() -> None:  # the test split's files too, where the data name one: eval reads them after training
            for split in (self.train, self.valid, *([load_split(cfg, "test")] if names_test_files(cfg) else [])):
                split.check()

        group.main_first(check)

    def prepare(self, run: Run, group: distributed.Group, ckpt: dict[str, Any] | None) -> Seq2SeqData:
        cfg = self.cfg
        start = self.start if cfg.scst_from else None
        vocab = (Vocabulary.from_bytes(ckpt["tokenizer"]) if ckpt else
                 Vocabulary.from_bytes(start["tokenizer"]) if start else
                 Vocabulary.build((t for caps in self.train.tokens for t in caps), cfg.min_count))
        train_ids = encode_captions(vocab, self.train, cfg.max_caption_len)
        valid_ids = encode_captions(vocab, self.valid, cfg.max_caption_len)
        pairs = sum(len(c) for c in train_ids)
        first = pair_batches(self.train, train_ids, 1)[0].to("cpu")
        info = {"train": self.train.name, "train_images": len(self.train), "train_pairs": pairs,
                "valid": self.valid.name, "valid_images": len(self.valid), "vocab_size": len(vocab)}
        said = (f"{self.train.name}: {pairs} (image, caption) pairs; vocabulary {len(vocab)} tokens: "
                f"{len(vocab) - len(vocab.SPECIALS)} words seen >= {cfg.min_count} times and "
                f"{len(vocab.SPECIALS)} special")
        valid = pair_batches(self.valid, valid_ids, cfg.batch_size)
        if not cfg.scst_from:
            return Seq2SeqData(self.train.name, len(vocab), vocab.to_bytes(),
                               lambda shuffle, gen: pair_batches(self.train, train_ids, cfg.batch_size, shuffle, gen),
                               valid, (first.src, first.tgt_in), info, said)
        objective = SelfCritical(vocab, self.train, cfg.scst_samples, cfg.max_caption_len + 1, cfg.seed)
        return Seq2SeqData(
            self.train.name, len(vocab), vocab.to_bytes(),
            lambda shuffle, gen: image_batches(self.train, cfg.batch_size, cfg.scst_samples, shuffle, gen),
            valid, (first.src, first.tgt_in), {**info, "scst_from": cfg.scst_from, "scst_from_step": start["step"]},
            f"self-critical training from {cfg.scst_from} (step {start['step']}), {cfg.scst_samples} samples an "
            f"image; {said}", objective=objective, init=None if ckpt else start["model"],
            generators={"scst": objective.generator})


def train(cfg: CaptionTrainConfig, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict[str, Any]:
    """Train a captioning run as ``cfg`` says (the translation loop); return the summary."""
    return train_seq2seq(cfg, "caption", CaptionSource, resume, overwrite, progress)
