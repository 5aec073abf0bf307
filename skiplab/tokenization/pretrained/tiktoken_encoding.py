"""tiktoken's OpenAI encodings (``gpt2``, ``r50k_base``, ``p50k_base``, ``cl100k_base``, ``o200k_base``), built
from a local file: nothing is downloaded.

tiktoken's ``get_encoding(name)`` fetches the encoding's BPE ranks from openaipublic.blob.core.windows.net; here
the user gives that file, and the encoding is built as ``tiktoken_ext/openai_public.py`` (tiktoken 0.14.0)
builds it: ``tiktoken.Encoding(name, pat_str, mergeable_ranks, special_tokens)`` with the pattern and special
tokens that file publishes for the name (:data:`ENCODINGS`). The ranks are read from

    NAME.tiktoken                one line a token, ``BASE64(token bytes) RANK`` (``load_tiktoken_bpe``'s format;
                                 the files ``r50k_base``/``p50k_base``/``cl100k_base``/``o200k_base.tiktoken``;
                                 ``r50k_base.tiktoken`` holds GPT-2's ranks)
    DIR/ with encoder.json       GPT-2's own release (``gpt-2/encodings/main/``, as tiktoken reads it for ``gpt2``:
    and vocab.bpe                ``data_gym_to_mergeable_bpe_ranks``): encoder.json maps each token, its bytes
                                 written as GPT-2's printable stand-ins (``encoder.py``'s ``bytes_to_unicode``),
                                 to its rank; vocab.bpe lists the merges in rank order after a ``#version`` line,
                                 merge i making token 256 + i (checked)

and kept in the ``.tiktoken`` form. End of text is the encoding's ``<|endoftext|>`` (or the special token named
by ``eot=``); the vocabulary is one past the largest id, special tokens included (``n_vocab``), and a file whose
ranks reach past the encoding's published vocabulary (:data:`VOCABULARY`) is refused. Text is encoded
with ``encode_ordinary``: a special token's text inside a document is text, so every text round-trips exactly.
``TiktokenEncoding.tokenizer_json`` writes the encoding as a Hugging Face tokenizer.json with the same ids (what
``skiplab export hf`` writes for a run with one).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from pathlib import Path
from typing import Any

from .base import PretrainedTokenizer, one_line, read_file, require
from .hf_tokenizer import INSTALL as HF_INSTALL

ENDOFTEXT, ENDOFPROMPT = "<|endoftext|>", "<|endofprompt|>"
FIM = {"<|fim_prefix|>": 100258, "<|fim_middle|>": 100259, "<|fim_suffix|>": 100260}
# The split patterns of openai_public.py (tiktoken 0.14.0): GPT-2's (r50k) in its faster, equivalent form, cl100k's,
# and o200k's seven alternatives.
R50K = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
CL100K = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|"""
          r"""\s*[\r\n]|\s+(?!\S)|\s""")
O200K = "|".join((
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
))
ENCODINGS: dict[str, tuple[str, dict[str, int]]] = {  # name -> (pattern, special tokens)
    "gpt2": (R50K, {ENDOFTEXT: 50256}),
    "r50k_base": (R50K, {ENDOFTEXT: 50256}),
    "p50k_base": (R50K, {ENDOFTEXT: 50256}),
    "cl100k_base": (CL100K, {ENDOFTEXT: 100257, **FIM, ENDOFPROMPT: 100276}),
    "o200k_base": (O200K, {ENDOFTEXT: 199999, ENDOFPROMPT: 200018}),
}
# Each encoding's vocabulary as published (``n_vocab``: openai_public.py's explicit_n_vocab, or one past its largest
# special token): every rank of its file lies below it, so a rank at or past it is a file of another encoding or a
# broken one (a rank of 2^32 - 1 would make a vocabulary of 2^32 ids, an embedding no machine holds).
VOCABULARY = {"gpt2": 50257, "r50k_base": 50257, "p50k_base": 50281, "cl100k_base": 100277, "o200k_base": 200019}
INSTALL = "'tiktoken>=0.7'"
_POSSESSIVE_INTERVAL = re.compile(r"(\\[pP]\{\w+\}|\\.|\[(?:\\.|[^\]\\])*\]|[^\\()\[\]])(\{\d+(?:,\d*)?\})\+")


class TiktokenEncoding(PretrainedTokenizer):
    kind = "tiktoken"

    def __init__(self, payload: bytes, header: dict[str, Any], where: str) -> None:
        super().__init__(payload, header, where)
        name = header.get("encoding", "")
        if name not in ENCODINGS:
            raise ValueError(f"unknown tiktoken encoding {name!r}; known: {', '.join(ENCODINGS)}")
        pattern, specials = ENCODINGS[name]
        ranks = parse_ranks(payload, where)
        check_ranks(ranks, specials, name, where)
        tiktoken = require("tiktoken", INSTALL, "tiktoken")
        self._enc = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
        self.name, self.vocab_size = name, self._enc.n_vocab
        if self.eot not in specials.values():
            raise ValueError(f"{where}: end-of-text id {self.eot} is not a special token of {name}")

    @property
    def file_name(self) -> str:
        return f"{self.name}.tiktoken"

    @classmethod
    def read(cls, name: str, path: str, eot: str, spec: str) -> TiktokenEncoding:
        """Encoding ``name`` with the ranks in ``path`` (a .tiktoken file, or GPT-2's folder); end of text its
        ``<|endoftext|>``, or the special token ``eot`` where given."""
        if name not in ENCODINGS:
            raise ValueError(f"unknown tiktoken encoding {name!r} in --tokenizer {spec}; known: {', '.join(ENCODINGS)}")
        specials = ENCODINGS[name][1]
        if eot and eot not in specials:
            raise ValueError(f"{eot!r} is not a special token of {name} (eot= in --tokenizer {spec}); "
                             f"known: {', '.join(specials)}")
        folder = Path(path).expanduser()
        try:
            payload = dump_ranks(gpt2_ranks(folder, spec)) if folder.is_dir() else read_file(
                folder, f"{name} ranks file", spec)
        except FileNotFoundError as err:
            if name != "gpt2" or folder.is_dir():
                raise
            raise FileNotFoundError(f"{err} (experiments/gpt2_tokenizer.sh DIR writes DIR/gpt2.tiktoken)") from None
        token = eot or ENDOFTEXT
        return cls(payload, {"encoding": name, "eot": specials[token], "eot_token": token}, str(folder))

    def tokenizer_json(self) -> bytes:
        """This encoding as a Hugging Face ``tokenizer.json`` that gives tiktoken's ids for every text.

        The construction (transformers' ``convert_slow_tokenizer.TikTokenConverter`` takes the same road, for
        Llama-3's and others' ``.tiktoken`` files)::

            model          BPE, vocab: each token's bytes written in GPT-2's stand-ins (:func:`gpt2_stand_ins`),
                           its rank its id; merges: :func:`bpe_merges`; ignore_merges=True
            pre-tokenizer  Split(the encoding's pattern, "isolated"; :func:`onig_pattern`), then
                           ByteLevel(add_prefix_space=False, use_regex=False): the pattern's pieces, each
                           written in stand-ins
            decoder        ByteLevel: stand-ins back to bytes, then UTF-8
            added tokens   the encoding's special tokens, special, at their ids (in the vocab too, so that
                           ids above a gap, cl100k's 100257 after its 100256 ranks, stay theirs)

        Why the ids are tiktoken's (its ``src/lib.rs``, ``byte_pair_merge``; tokenizers' ``models/bpe/word.rs``,
        ``merge_all``): both cut the text into the same pieces (the same regex, every character in a piece for
        each of the patterns, and no piece is a whole special token: ``<|`` stops at the letters). A piece that
        is a token is that token in both (ignore_merges). Otherwise both start from its bytes and merge, again
        and again, one adjacent pair: tiktoken the pair whose join has the lowest rank, the leftmost of equals;
        BPE the pair of the first merge in the list, the leftmost of equals. An adjacent pair is in the merges
        exactly when its join is a token, which is when tiktoken may merge it (its parts are always tokens), and
        the merges are ordered by the rank of the join first, so both merge the same join at every step, and at
        the same place where one split of it is present. The one freedom left: two different splits of one
        token present at once (``ab|a|ba`` holds ``ab+a`` and ``a+ba``), tiktoken merging the leftmost, BPE the
        split first in :func:`bpe_merges`; transformers' converter has it too, and it never changed an id in
        the checks (17 MB of text against GPT-2's ranks under the gpt2, cl100k and o200k patterns).

        A special token's text inside a document is text to the run (``encode_ordinary``); a Hugging Face
        tokenizer reads it as the token unless told to split special tokens (``encode_special_tokens``, in
        transformers ``split_special_tokens=True``)."""
        tokenizers = require("tokenizers", HF_INSTALL, "Hugging Face")
        from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

        pattern, specials = ENCODINGS[self.name]
        ranks = parse_ranks(self.payload, self.where)
        shown = {b: c for c, b in gpt2_stand_ins().items()}

        def stand_in(token: bytes) -> str:
            return "".join(shown[b] for b in token)

        vocab = {**{stand_in(t): r for t, r in ranks.items()}, **specials}
        merges = [(stand_in(a), stand_in(b)) for a, b in bpe_merges(ranks)]
        tok = tokenizers.Tokenizer(models.BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(onig_pattern(pattern)), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
        return tok.to_str().encode("utf-8")

    def _encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def _decode(self, ids: list[int]) -> str:
        try:
            data = self._enc.decode_bytes(ids)
        except KeyError:  # an id of no token (a gap below the special tokens) reads as U+FFFD
            data = b"".join(self._token_bytes(i) for i in ids)
        return data.decode("utf-8", "replace")

    def _token_bytes(self, i: int) -> bytes:
        try:
            return self._enc.decode_single_token_bytes(i)
        except KeyError:
            return "\ufffd".encode()


def parse_ranks(data: bytes, where: str) -> dict[bytes, int]:
    """The ranks of a ``.tiktoken`` file: ``BASE64 RANK`` a line, blank lines ignored."""
    ranks: dict[bytes, int] = {}
    for n, line in enumerate(data.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        try:
            if len(parts) != 2:
                raise ValueError
            token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
        except (ValueError, binascii.Error):
            raise ValueError(f"{where}, line {n}: not a tiktoken ranks line (base64 token, space, rank)") from None
        if token in ranks:
            raise ValueError(f"{where}, line {n}: token {token!r} listed twice")
        ranks[token] = rank
    return ranks


def check_ranks(ranks: dict[bytes, int], specials: dict[str, int], name: str, where: str) -> None:
    """Every byte a token, no rank twice, every rank below the encoding's vocabulary (:data:`VOCABULARY`), none an
    id of its special tokens."""
    if not ranks:
        raise ValueError(f"{where}: no ranks in the file")
    top = max(ranks.values())
    if top >= VOCABULARY[name]:
        raise ValueError(f"{where}: rank {top} is past {name}'s vocabulary of {VOCABULARY[name]} ids; is this "
                         f"{name}'s file?")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise ValueError(f"{where}: byte 0x{missing[0]:02x} has no rank ({len(missing)} bytes missing): not a "
                         "byte-level BPE ranks file")
    if len(set(ranks.values())) != len(ranks) or min(ranks.values()) < 0:
        raise ValueError(f"{where}: ranks repeat or are negative")
    taken = sorted(set(ranks.values()) & set(specials.values()))
    if taken:
        raise ValueError(f"{where}: rank {taken[0]} is the id of a special token of {name}; is this {name}'s file?")


def onig_pattern(pattern: str) -> str:
    r"""``pattern`` (tiktoken's, read by fancy-regex) written so that Oniguruma, the regex engine of tokenizers'
    ``Regex``, reads it the same: Oniguruma's Ruby syntax reads ``X{n,m}+`` (cl100k's ``\p{N}{1,3}+``, possessive
    in fancy-regex) as ``(X{n,m})+``, a run of any length; the atomic group ``(?>X{n,m})`` is what possessive
    means (Oniguruma's ``doc/RE``: "{n,m}+, {n,}+, {n}+ are possessive operators in syntax_java and syntax_perl
    only"). ``X++``, ``X*+`` and ``X?+`` are possessive in both. X is one atom: a character, an escape,
    ``\p{...}`` or a ``[...]`` class. (Ruby's ``$`` is the end of a line, not of the text, but ``\s++$`` reads the
    same: the possessive run leaves no newline after it.)"""
    return _POSSESSIVE_INTERVAL.sub(r"(?>\1\2)", pattern)


def bpe_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merges of a BPE that merges as tiktoken does with ``ranks``: for each token of two bytes or more,
    every split ``(left, right)`` of it whose halves are both tokens, ordered by the rank of the token, then by
    the ranks of the left and the right half (the order of transformers' ``TikTokenConverter``)."""
    splits = [(r, ranks[t[:i]], ranks[t[i:]], t[:i], t[i:]) for t, r in ranks.items() for i in range(1, len(t))
              if t[:i] in ranks and t[i:] in ranks]
    return [(left, right) for *_, left, right in sorted(splits)]


def dump_ranks(ranks: dict[bytes, int]) -> bytes:
    """The ``.tiktoken`` form of ``ranks``, in rank order."""
    return b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in sorted(ranks.items(), key=lambda kv: kv[1]))


def gpt2_stand_ins() -> dict[str, int]:
    """GPT-2's printable stand-in of each byte (``bytes_to_unicode`` of its ``encoder.py``) -> the byte: a byte
    that is a printable character other than space stands for itself; the others, in byte order, are
    written chr(256), chr(257), ..."""
    shown = [b for b in range(256) if chr(b).isprintable() and b != 0x20]
    hidden = [b for b in range(256) if b not in shown]
    return {**{chr(b): b for b in shown}, **{chr(256 + n): b for n, b in enumerate(hidden)}}


def gpt2_ranks(folder: Path, spec: str) -> dict[bytes, int]:
    """The ranks of GPT-2's ``encoder.json`` in ``folder``, checked against the merges of its ``vocab.bpe``."""
    encoder_file, merges_file = folder / "encoder.json", folder / "vocab.bpe"
    encoder_text = read_file(encoder_file, "GPT-2 encoder.json", spec)
    merges_text = read_file(merges_file, "GPT-2 vocab.bpe", spec)
    byte_of = gpt2_stand_ins()

    def to_bytes(token: str, where: Path) -> bytes:
        try:
            return bytes(byte_of[c] for c in token)
        except KeyError as exc:
            raise ValueError(f"{where}: {token!r} holds {exc.args[0]!r}, no byte's stand-in") from None

    try:
        encoder = json.loads(encoder_text)
        if not isinstance(encoder, dict) or not all(isinstance(v, int) for v in encoder.values()):
            raise ValueError("not an object of token -> id")
    except ValueError as exc:
        raise ValueError(f"{encoder_file}: not GPT-2's encoder.json ({one_line(exc)})") from None
    ranks = {to_bytes(t, encoder_file): i for t, i in encoder.items() if t not in (ENDOFTEXT, "<|startoftext|>")}
    lines = merges_text.decode("utf-8", "replace").split("\n")
    for n, line in enumerate(lines[1:], 2):  # line 1 is "#version: ..."
        if not line:
            continue
        pair = line.split()
        merged = to_bytes("".join(pair), merges_file) if len(pair) == 2 else None
        if merged is None or ranks.get(merged) != 256 + n - 2:
            raise ValueError(f"{merges_file}, line {n}: merge {line!r} is not token {256 + n - 2} of "
                             f"{encoder_file.name}")
    return ranks
