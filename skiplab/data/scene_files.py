"""fashion-mnist-scenes on disk: the composed set (:mod:`skiplab.data.scenes`) written in the formats of MSCOCO and
Karpathy's split file, which :mod:`skiplab.data.captions` reads (the layout: :mod:`skiplab.data.scenes`'s docstring).

    images/<split>_<index:06d>.png, captions_<split>.json (COCO), dataset.json (Karpathy), scenes.json (contents)

Nothing is overwritten: ``out_dir`` must be absent or empty, and the files are written into a folder beside it and
renamed into place at the end, so a failure leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from .scenes import CANVAS, CELL_NAMES, CLASS_WORDS, DATASET, HOLDOUT, SCENE_SPLITS, Scenes, fashion_scenes
from .captions import tokenize


def write_scenes(fashion_dir: str | os.PathLike, out_dir: str | os.PathLike, sizes: Mapping[str, int] | None = None,
                 seed: int = 0, holdout: int = HOLDOUT) -> Path:
    """Write the splits ``sizes`` (split -> scenes, default :data:`SCENE_SPLITS`) into ``out_dir`` in the COCO
    formats (see the module docstring); returns ``out_dir``.

    ``out_dir`` must not exist or be empty: nothing is overwritten. The files are written into a folder
    beside it and renamed into place at the end, so a failure leaves nothing behind.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise FileExistsError(f"{out_dir}: already exists and is not an empty folder; refusing to overwrite it")
    sizes = dict(SCENE_SPLITS if sizes is None else sizes)
    for split in sizes:
        if split not in SCENE_SPLITS:
            raise ValueError(f"unknown split {split!r}; known: {', '.join(SCENE_SPLITS)}")
    splits = {s: fashion_scenes(fashion_dir, s, sizes[s], seed, holdout) for s in SCENE_SPLITS if s in sizes}
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = out_dir.with_name(f".{out_dir.name}.partial-{os.getpid()}")
    try:
        _write(partial, splits, f"seed {seed}, holdout {holdout}")
        partial.rename(out_dir)  # also onto an empty folder
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return out_dir


def _write(root: Path, splits: dict[str, Scenes], about: str) -> None:
    from PIL import Image

    (root / "images").mkdir(parents=True)
    karpathy, contents, imgid, sentid = [], [], 0, 0
    for split, scenes in splits.items():
        coco_images, annotations = [], []
        for i in range(len(scenes)):
            name = f"{split}_{i:06d}.png"
            Image.fromarray(scenes.pixels[i]).save(root / "images" / name, format="PNG")
            coco_images.append({"id": imgid + 1, "file_name": name, "height": CANVAS, "width": CANVAS})
            sentences = []
            for caption in scenes.captions[i]:
                annotations.append({"id": sentid + 1, "image_id": imgid + 1, "caption": caption})
                sentences.append({"tokens": tokenize(caption), "raw": caption, "imgid": imgid, "sentid": sentid})
                sentid += 1
            karpathy.append({"filepath": "images", "filename": name, "imgid": imgid, "split": split,
                             "sentences": sentences, "sentids": [s["sentid"] for s in sentences], "cocoid": imgid + 1})
            contents.append({"id": imgid + 1, "split": split, "file_name": name, "cells": scenes.cells[i].tolist(),
                             "sources": scenes.sources[i].tolist()})
            imgid += 1
        info = {"description": f"{DATASET} {split} ({about})", "version": "1.0"}
        _dump(root / f"captions_{split}.json", {"info": info, "licenses": [], "type": "captions",
                                                "images": coco_images, "annotations": annotations})
    _dump(root / "dataset.json", {"dataset": DATASET, "images": karpathy})
    _dump(root / "scenes.json", {"cells": list(CELL_NAMES), "classes": [s for s, _ in CLASS_WORDS], "images": contents})


def _dump(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, separators=(",", ":")) + "\n", encoding="utf-8")
