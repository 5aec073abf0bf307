"""A sentencepiece ``.model`` file of any id layout (T5's ``spiece.model``, LLaMA-2's ``tokenizer.model``, ...).

The file is sentencepiece's serialised ``ModelProto`` (``sentencepiece_model.proto``): the pieces in id order,
the trainer's spec with the special ids, the normaliser. Nothing is assumed about the ids: end of text is the
model's own EOS id, read from it (``eos_id()``: T5's is 1, with pad 0 and unk 2; LLaMA-2's is 2, with unk 0 and
bos 1 and no pad), or the piece named by ``eot=`` (a model with no EOS, ``eos_id = -1``, must name one).
The vocabulary is every piece, ``get_piece_size()``. Text is encoded as the model says (its normaliser, its
dummy prefix), with no BOS or EOS added; decoding drops control pieces (pad, bos, eos) as sentencepiece does.
"""

from __future__ import annotations

from typing import Any

from .base import PretrainedTokenizer, one_line, read_file


class SentencepieceModel(PretrainedTokenizer):
    kind = "sentencepiece"
    file_name = "tokenizer.model"

    def __init__(self, payload: bytes, header: dict[str, Any], where: str) -> None:
        super().__init__(payload, header, where)
        import sentencepiece as spm  # a core dependency, imported here as the other formats are

        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(payload)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"{where}: not a sentencepiece model ({one_line(exc)})") from None
        self.vocab_size = self._sp.get_piece_size()
        if not 0 <= self.eot < self.vocab_size:
            raise ValueError(f"{where}: end-of-text id {self.eot} is not an id of its {self.vocab_size} pieces")

    @classmethod
    def read(cls, path: str, eot: str, spec: str) -> SentencepieceModel:
        """The model in ``path``; end of text its EOS id, or the piece ``eot`` where given."""
        payload = read_file(path, "sentencepiece model", spec)
        probe = cls(payload, {"eot": 0}, path)  # loads, or says the file is not a model
        sp = probe._sp
        if eot:
            found = sp.piece_to_id(eot)
            if sp.id_to_piece(found) != eot:
                raise ValueError(f"{path}: {eot!r} is not a piece of the model (eot= in --tokenizer {spec})")
        else:
            found = sp.eos_id()
            if found < 0:
                raise ValueError(f"{path}: the model has no EOS id; name the end-of-text piece: "
                                 f"--tokenizer 'sentencepiece(eot=PIECE):{path}'")
        return cls(payload, {"eot": found, "eot_token": sp.id_to_piece(found)}, path)

    def _encode(self, text: str) -> list[int]:
        return self._sp.encode(text, out_type=int)

    def _decode(self, ids: list[int]) -> str:
        return self._sp.decode(ids)
