"""The work folder a corpus command writes its output in: ``OUT.partial`` beside ``OUT``, renamed to ``OUT`` when
complete, so that nothing partial is ever left under ``OUT``.

A file inside it (``.skiplab-<the command's first word>``: ``.skiplab-prepare``, ``.skiplab-corpus``) marks the
folder as the command's: an ``OUT.partial`` that an interrupted run of the command left holds the mark and is removed
by the next run; one without it is somebody else's and is left as it is (a one-line error before anything is
written).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def mark_of(command: str) -> str:
    """The name of the mark file of ``command`` (``prepare lm``, ``corpus debdocs``)."""
    return f".skiplab-{command.split()[0]}"


def write_beside(out: Path, command: str, fill: Callable[[Path], T]) -> T:
    """``fill(work)`` into ``out``'s work folder, then the folder renamed to ``out``; what ``fill`` returns. ``out``
    must not exist; a work folder without ``command``'s mark is refused; on any error the work folder is removed."""
    if out.exists():
        raise FileExistsError(f"{out}: already exists; give another --out or remove it")
    work, mark = out.with_name(out.name + ".partial"), mark_of(command)
    if work.exists() and not (work / mark).is_file():
        raise FileExistsError(f"{work}: already exists and is not what an interrupted skiplab {command} leaves "
                              f"(no {mark} mark in it); move it away or give another --out")
    if work.exists():  # what an interrupted run of this command left
        shutil.rmtree(work)
    work.mkdir(parents=True)
    (work / mark).write_text(f"the work folder of skiplab {command} --out {out}; removed when complete\n")
    try:
        result = fill(work)
        (work / mark).unlink()
        os.replace(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return result
