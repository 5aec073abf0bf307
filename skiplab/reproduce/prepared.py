"""A folder of ``skiplab prepare lm`` that a paper-scale setting trains from, and how a command names its root.

``reproduce`` never downloads or tokenises: a setting that trains from prepared shards names the folder under
``--data-root`` it needs (:class:`PreparedData`), checks that the folder there holds that text in those tokens, and
where it does not, says what must be there and the ``skiplab prepare lm`` command that makes it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from ..corpora.shards import SIDECAR, check_prepared, is_prepared, read_prepared
from ..tokenization.pretrained import parse_pretrained
from ..tokenization.pretrained.base import one_line

DATA_ROOT = "DATA_ROOT"  # how a command names the --data-root where none is given


@dataclass(frozen=True)
class PreparedData:
    """A folder of ``skiplab prepare lm`` that a setting trains from, ``DATA_ROOT/<folder>``, and what it must hold.

    Nothing is downloaded or tokenised by ``reproduce``: where the folder is absent, or holds other data or other
    tokens, the setting's cells say what is needed (:meth:`find`): the text, the tokenizer's file and where it comes
    from, and the ``skiplab prepare lm`` command that makes the folder. The runs name the tokenizer by its kind and
    a bare file name (``sentencepiece:spiece.model``): a run on a prepared folder reads the tokenizer the folder
    carries, and a pretrained tokenizer's path is not part of what a run is (``check_prepared``), so the runs'
    keys do not depend on where the file was when the folder was made."""

    folder: str  # its name under --data-root
    corpus: str  # the corpus its sidecar names ("" where it was prepared from files)
    tokenizer: str  # the runs' --tokenizer: a pretrained kind and a bare file name
    vocab_size: int  # the tokenizer's ids, as the sidecar records them
    eot: int  # its end-of-text id, as the sidecar records it
    data: str  # the text, in words
    tokenizer_about: str  # the tokenizer's file and where it comes from
    prepare: str  # ``skiplab prepare lm``'s options before --out; DATA_ROOT stands for the data root
    splits: tuple[str, ...] = ("train", "valid", "test")  # valid: validation while training; test: the final score
    caveat: str = ""  # what stays unlike the paper once the folder is there

    def command(self, root: str = "") -> str:
        """The command that makes the folder under ``root`` (DATA_ROOT where none is given)."""
        args = [*shlex.split(self.prepare), "--out", f"{DATA_ROOT}/{self.folder}"]
        return shlex.join(["skiplab", "prepare", "lm", *(_rooted(a, root) for a in args)])

    def needs(self, root: str = "") -> str:
        """What the folder holds and how to make it, in one line."""
        data = self.data.replace(f"{DATA_ROOT}/", f"{Path(root).expanduser()}/") if root else self.data
        return f"{data} tokenised with {self.tokenizer_about}, made once with: {self.command(root)}"

    def find(self, root: str) -> tuple[str, str]:
        """(the folder, "") where ``root`` holds it as the setting needs it; else ("", what is needed)."""
        then = f"; once it is there, {self.caveat}" if self.caveat else ""
        if not root:
            return "", f"needs {DATA_ROOT}/{self.folder} (--data-root {DATA_ROOT}): {self.needs()}{then}"
        path = Path(root).expanduser() / self.folder
        if not is_prepared(path):
            what = "holds no " + SIDECAR if path.is_dir() else "is absent"
            return "", f"needs {path}, which {what}: {self.needs(root)}{then}"
        problem = self.mismatch(path)
        if problem:
            return "", (f"needs {path} made anew ({problem}; move it aside first, prepare never replaces a folder): "
                        f"{self.needs(root)}{then}")
        return str(path), ""

    def mismatch(self, path: Path) -> str:
        """How the prepared folder ``path`` differs from what the setting needs ("" where it does not)."""
        try:
            prep = read_prepared(path)
            meta = prep.meta
            theirs, ours = parse_pretrained(meta["tokenizer"]), parse_pretrained(self.tokenizer)
            if meta["corpus"] != self.corpus:
                return f"it holds {meta['corpus'] or 'files'}, not {self.corpus or 'files'}"
            if (theirs is None or theirs.kind != ours.kind or prep.vocab_size != self.vocab_size
                    or int(meta["eot"]) != self.eot):
                return (f"it was prepared with --tokenizer {meta['tokenizer']} ({prep.vocab_size:,} ids, end of text "
                        f"{meta['eot']}), not a {ours.kind} tokenizer of {self.vocab_size:,} ids (end of text "
                        f"{self.eot})")
            missing = [s for s in self.splits if s not in meta["splits"]]
            if missing:
                return f"it has no {' or '.join(missing)} split"
            check_prepared(prep, self.corpus, self.tokenizer, self.vocab_size)  # what a run checks
        except (OSError, ValueError) as exc:
            return one_line(exc)
        return ""


def _rooted(arg: str, root: str) -> str:
    """A command's argument with a leading DATA_ROOT/ made ``root``'s (where one is given)."""
    if not root or not arg.startswith(f"{DATA_ROOT}/"):
        return arg
    return str(Path(root).expanduser() / arg.removeprefix(f"{DATA_ROOT}/"))
