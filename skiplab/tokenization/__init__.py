"""Tokenizers: text to ids and back.

- :mod:`~skiplab.tokenization.subwords`: sentencepiece subwords with one joint vocabulary (translation, captioning
  corpora), :class:`Tokenizer`;
- :mod:`~skiplab.tokenization.lm`: the language models' tokenizers (UTF-8 bytes, lossless subwords trained on the
  training split, a pretrained tokenizer), stored in every run;
- :mod:`~skiplab.tokenization.pretrained`: pretrained tokenizers read from local files in their own formats
  (sentencepiece ``.model``, Hugging Face ``tokenizer.json``, tiktoken ranks);
- :mod:`~skiplab.tokenization.moses`: Moses' conventions for tokenised text (escapes, the tokenizer, the detokenizer).

>>> from skiplab.tokenization import Tokenizer
>>> tok = Tokenizer.train(sentences, "runs/spm", vocab_size=8000)
"""

from .subwords import MODEL_TYPES, Tokenizer

__all__ = ["MODEL_TYPES", "Tokenizer"]
