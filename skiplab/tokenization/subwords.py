"""Subword tokenisation with sentencepiece: one joint vocabulary for source and target.

The special ids are fixed at training time (PAD 0, UNK 1, BOS 2, EOS 3), so models and batching can
use the class constants without asking the tokenizer. Text is not normalised (``identity`` rule), so
decoding the encoding of a sentence gives it back exactly, provided its characters were seen in
training and its whitespace is single spaces between words (runs of spaces are collapsed, leading and
trailing spaces dropped).
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

MODEL_TYPES = ("bpe", "unigram")


class Tokenizer:
    """A joint source/target subword model."""

    PAD, UNK, BOS, EOS = 0, 1, 2, 3  # the ids, fixed at training time
    _SPECIALS = {PAD: "<pad>", UNK: "<unk>", BOS: "<s>", EOS: "</s>"}

    def __init__(self, processor: spm.SentencePieceProcessor) -> None:
        """Wrap a loaded processor; use :meth:`train`, :meth:`load` or :meth:`from_bytes` instead."""
        self._sp = processor

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        model_prefix: str | Path,
        vocab_size: int = 8000,
        model_type: str = "bpe",
        character_coverage: float = 1.0,
        lossless: bool = False,
    ) -> Tokenizer:
        """Train on ``texts`` (both sides of the training corpus), write ``MODEL_PREFIX.model`` and
        ``.vocab``, and return the loaded tokenizer.

        Deterministic: the lines are used in order, all of them (no sampling, no shuffling).
        ``vocab_size`` is an upper bound: on little text the vocabulary comes out smaller.
        ``lossless`` (language models) keeps runs of spaces, makes the newline a piece of its own and falls
        back to the 256 byte pieces for characters not seen in training, so that decoding the encoding of
        any text gives it back exactly.
        """
        if model_type not in MODEL_TYPES:
            raise ValueError(f"unknown model_type {model_type!r}; known: {', '.join(MODEL_TYPES)}")
        if not isinstance(vocab_size, int) or vocab_size <= len(cls._SPECIALS):
            raise ValueError(f"vocab_size must be an integer above {len(cls._SPECIALS)}, got {vocab_size!r}")
        if not 0.0 < character_coverage <= 1.0:
            raise ValueError(f"character_coverage must be in (0, 1], got {character_coverage!r}")
        # Blank lines carry nothing to learn; sentencepiece fails obscurely when nothing is left.
        lines = [t for t in texts if t.strip()]
        if not lines:
            raise ValueError(f"{model_prefix}: no text to train the tokenizer on")
        prefix = Path(model_prefix)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        try:
            writer = io.BytesIO()  # the model written here, not under model_prefix: sentencepiece keeps that path
            # in the model, and the same text and options then gave other bytes in another folder
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(lines),
                model_writer=writer,
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=character_coverage,
                normalization_rule_name="identity",  # exact round trip; NFKC would e.g. turn "ﬁ" into "fi"
                pad_id=cls.PAD,
                unk_id=cls.UNK,
                bos_id=cls.BOS,
                eos_id=cls.EOS,
                hard_vocab_limit=False,  # a smaller vocabulary rather than an error on small corpora
                input_sentence_size=0,  # all lines: sampling would make training depend on a seed
                shuffle_input_sentence=False,
                num_threads=2,
                minloglevel=2,  # sentencepiece otherwise logs hundreds of lines to stderr
                **(dict(remove_extra_whitespaces=False, byte_fallback=True, user_defined_symbols=["\n"],
                        allow_whitespace_only_pieces=True) if lossless else {}),
            )
        except RuntimeError as exc:
            raise ValueError(_training_error(prefix, vocab_size, exc)) from None
        model = prefix.with_name(prefix.name + ".model")
        model.write_bytes(writer.getvalue())
        tokenizer = cls.load(model)
        sp = tokenizer._sp  # the piece list beside it, as sentencepiece writes it (piece, tab, score)
        prefix.with_name(prefix.name + ".vocab").write_text(
            "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.get_piece_size())))
        return tokenizer

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Load a ``.model`` file written by :meth:`train`."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file")
        return cls._from_bytes(path.read_bytes(), str(path))

    @classmethod
    def from_bytes(cls, data: bytes) -> Tokenizer:
        """Load a serialized model (what :meth:`to_bytes` returns, e.g. embedded in a checkpoint)."""
        return cls._from_bytes(data, "tokenizer bytes")

    def to_bytes(self) -> bytes:
        """The serialized model: :meth:`from_bytes` of it gives the same tokenizer."""
        return self._sp.serialized_model_proto()

    @property
    def vocab_size(self) -> int:
        """The number of ids, specials included: ids are in ``range(vocab_size)``."""
        return self._sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """The subword ids of ``text``, without BOS or EOS."""
        return self._sp.encode(text, out_type=int)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """:meth:`encode` of each text, in one call (faster than a Python loop)."""
        return self._sp.encode(list(texts), out_type=int)

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids`` (a list or a 1-D tensor); PAD, BOS and EOS are skipped."""
        skip = (self.PAD, self.BOS, self.EOS)
        kept = [i for i in map(int, ids) if i not in skip]
        for i in kept:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"id {i} is out of range for a vocabulary of {self.vocab_size}")
        return self._sp.decode(kept)

    def piece(self, i: int) -> str:
        """The subword of id ``i`` (e.g. ``"▁the"``; ``"<pad>"`` for 0)."""
        if not 0 <= i < self.vocab_size:
            raise ValueError(f"id {i} is out of range for a vocabulary of {self.vocab_size}")
        return self._sp.id_to_piece(i)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size})"

    # Pickling (DataLoader workers, multiprocessing) goes through the serialized model.
    def __getstate__(self) -> bytes:
        return self.to_bytes()

    def __setstate__(self, state: bytes) -> None:
        self._sp = Tokenizer.from_bytes(state)._sp

    @classmethod
    def _from_bytes(cls, data: bytes, where: str) -> Tokenizer:
        sp = spm.SentencePieceProcessor()
        try:
            sp.LoadFromSerializedProto(data)
        except RuntimeError as exc:
            raise ValueError(f"{where}: not a sentencepiece model ({_one_line(exc)})") from None
        # A model trained elsewhere may use other special ids; batching and models rely on these.
        found = {i: sp.id_to_piece(i) for i in cls._SPECIALS if i < sp.get_piece_size()}
        ids = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
        if found != cls._SPECIALS or ids != (cls.PAD, cls.UNK, cls.BOS, cls.EOS):
            raise ValueError(
                f"{where}: special ids are not pad=0 unk=1 bos=2 eos=3 (found pad/unk/bos/eos ids {ids}); "
                "train the tokenizer with Tokenizer.train"
            )
        return cls(sp)


def _training_error(prefix: Path, vocab_size: int, exc: RuntimeError) -> str:
    msg = _one_line(exc)
    if "Vocabulary size too high" in msg:
        limit = re.search(r"value <= (\d+)", msg)
        at_most = f" (at most {limit.group(1)})" if limit else ""
        return f"{prefix}: vocab size {vocab_size} is too large for this text{at_most}; use a smaller --vocab-size"
    if "smaller than required_chars" in msg:
        need = re.search(r"(\d+) vs (\d+)", msg)  # "<vocab_size> vs <distinct characters + specials>"
        at_least = f" (it needs at least {need.group(2)}: every distinct character, plus the specials)" if need else ""
        return f"{prefix}: vocab size {vocab_size} is too small for this text{at_least}; use a larger --vocab-size"
    return f"{prefix}: sentencepiece training failed: {msg}"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
