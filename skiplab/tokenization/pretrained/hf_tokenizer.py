"""A Hugging Face ``tokenizer.json``: the ``tokenizers`` library's one-file format (GPT-2's byte-level BPE,
GPT-NeoX and OLMo, LLaMA-3, Mistral, T5's converted unigram, ...).

The file is the JSON ``Tokenizer.to_str()`` writes (normaliser, pre-tokeniser, model, decoder, post-processor,
and ``added_tokens``: a list of ``{"id", "content", "special", ...}``). End of text is read from it: the one
special added token whose content is an end-of-text name of :data:`EOT_NAMES` (GPT-2 and GPT-NeoX's
``<|endoftext|>``, LLaMA-3's ``<|end_of_text|>``, the ``</s>`` of sentencepiece conversions, Gemma's ``<eos>``),
or the token named by ``eot=`` where the file has none of them, or several. The vocabulary is one past the
largest id, added tokens included (``get_vocab(with_added_tokens=True)``). Text is encoded with
``add_special_tokens=False`` (no BOS or template tokens); an added token's text inside a document is that token,
as the library reads it. Decoding keeps every token but end of text (``skip_special_tokens=False``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .base import PretrainedTokenizer, one_line, read_file, require

EOT_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>")
INSTALL = "'skiplab[hf]' (or tokenizers)"


class HFTokenizer(PretrainedTokenizer):
    kind = "hf"
    file_name = "tokenizer.json"

    def __init__(self, payload: bytes, header: dict[str, Any], where: str) -> None:
        super().__init__(payload, header, where)
        tokenizers = require("tokenizers", INSTALL, "Hugging Face")
        try:
            self._tok = tokenizers.Tokenizer.from_str(payload.decode("utf-8"))
        except Exception as exc:  # noqa: BLE001 - the library raises a bare Exception for a bad file
            raise ValueError(f"{where}: not a Hugging Face tokenizer.json ({one_line(exc)})") from None
        self.vocab_size = max(self._tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1
        if not 0 <= self.eot < self.vocab_size:
            raise ValueError(f"{where}: end-of-text id {self.eot} is not an id of its {self.vocab_size} tokens")

    @classmethod
    def read(cls, path: str, eot: str, spec: str) -> HFTokenizer:
        """The tokenizer in ``path`` (a tokenizer.json, or a folder holding one); end of text as the module says."""
        file = Path(path).expanduser()
        if file.is_dir():
            file = file / "tokenizer.json"
        payload = read_file(file, "Hugging Face tokenizer.json", spec)
        probe = cls(payload, {"eot": 0}, str(file))  # loads, or says the file is not a tokenizer
        if eot:
            found = probe._tok.token_to_id(eot)
            if found is None:
                raise ValueError(f"{file}: {eot!r} is not a token of the tokenizer (eot= in --tokenizer {spec})")
            return cls(payload, {"eot": found, "eot_token": eot}, str(file))
        added = json.loads(payload).get("added_tokens") or []
        named = sorted({(t["content"], t["id"]) for t in added if t.get("special") and t.get("content") in EOT_NAMES})
        if len(named) != 1:
            what = (f"several end-of-text tokens ({', '.join(c for c, _ in named)})" if named
                    else f"no end-of-text token (no special token {' '.join(EOT_NAMES)})")
            raise ValueError(f"{file}: {what}; name it: --tokenizer 'hf(eot=TOKEN):{path}'")
        (content, found), = named
        return cls(payload, {"eot": found, "eot_token": content}, str(file))

    def token(self, i: int) -> str | None:
        """The token with id ``i`` as the file writes it (None where it has none)."""
        return self._tok.id_to_token(i)

    def _encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)
