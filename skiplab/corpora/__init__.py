"""Text corpora on disk and what a model reads of them.

Translation's parallel corpora and their token batches are exported here; language modelling's documents
(:mod:`~skiplab.corpora.documents`), the ``debdocs`` corpus (:mod:`~skiplab.corpora.debdocs`, built from prose
by :mod:`~skiplab.corpora.prose`), token shards (:mod:`~skiplab.corpora.shards`, written by
:mod:`~skiplab.corpora.prepare`) and the windows a model trains on (:mod:`~skiplab.corpora.windows`) are
imported from their modules. Tokenizers live in :mod:`skiplab.tokenization`.

>>> from skiplab.corpora import load_corpus, encode_parallel, filter_long, make_batches
>>> from skiplab.tokenization import Tokenizer
>>> train = load_corpus("multi30k", None, "en", "de", "train")     # Parallel: 29000 pairs
>>> valid = load_corpus("wmt14-en-de(valid=newstest2012+newstest2013)", None, "en", "de", "valid")
>>> tok = Tokenizer.train(train.src + train.tgt, "runs/spm", vocab_size=8000)
>>> src, tgt = encode_parallel(tok, train)
>>> keep, dropped = filter_long(src, tgt, max_len=256)
>>> batches = make_batches(src, tgt, max_tokens=4096, indices=keep, shuffle=True, generator=g)
"""

from .batching import Batch, collate, encode_parallel, filter_long, make_batches
from .parallel import (
    CORPORA,
    SPLITS,
    CorpusInfo,
    CorpusSpec,
    Parallel,
    decode_lines,
    default_data_dir,
    fetch,
    load_corpus,
    load_split,
    parse_corpus,
    read_lines,
    read_parallel,
)

__all__ = [
    "CORPORA",
    "SPLITS",
    "Batch",
    "CorpusInfo",
    "CorpusSpec",
    "Parallel",
    "collate",
    "decode_lines",
    "default_data_dir",
    "encode_parallel",
    "fetch",
    "filter_long",
    "load_corpus",
    "load_split",
    "make_batches",
    "parse_corpus",
    "read_lines",
    "read_parallel",
]
