"""Moses conventions for tokenised text: the escaped special characters, the tokenizer and the detokenizer.

The Stanford NMT group's prepared corpora (IWSLT'15 En-Vi, WMT'14 En-De) went through Moses'
``tokenizer.perl``, which splits punctuation off words and escapes eight characters as entities
(``escape-special-chars.perl``, reproduced by sacremoses' ``MosesTokenizer.escape_xml``)::

    &  -> &amp;     |  -> &#124;    <  -> &lt;     >  -> &gt;
    '  -> &apos;    "  -> &quot;    [  -> &#91;    ]  -> &#93;

:func:`unescape` undoes exactly these, plus the older ``&bar;`` (|), ``&bra;`` ([) and ``&ket;`` (]) that
Moses' ``deescape-special-chars.perl`` also reads. It is not :func:`html.unescape`: on these entities the
two agree, but ``html.unescape`` decodes every other HTML entity too, some even without their ``;``
(``"&copy 2014"`` -> ``"© 2014"``), which would change text that Moses never escaped.

The tokenizer and detokenizer are sacremoses' Python ports of ``tokenizer.perl`` and
``detokenizer.perl`` (default options: no aggressive hyphen splitting), used here on unescaped text,
so they neither escape nor unescape.
"""

from __future__ import annotations

import re
from functools import lru_cache

# deescape-special-chars.perl, in one pass: "&amp;quot;" becomes "&quot;", as it does there (&amp; last).
ENTITIES: dict[str, str] = {
    "&amp;": "&",
    "&#124;": "|",
    "&lt;": "<",
    "&gt;": ">",
    "&apos;": "'",
    "&quot;": '"',
    "&#91;": "[",
    "&#93;": "]",
    "&bar;": "|",
    "&bra;": "[",
    "&ket;": "]",
}
_ENTITY = re.compile("|".join(re.escape(e) for e in ENTITIES))


def unescape(line: str) -> str:
    """``line`` with Moses' escaped special characters (see the module docstring) turned back into characters."""
    return _ENTITY.sub(lambda m: ENTITIES[m.group(0)], line) if "&" in line else line


def tokenize(lines: list[str], lang: str) -> list[str]:
    """Moses-tokenise raw ``lines`` (sacremoses ``MosesTokenizer(lang)``, no escaping): tokens joined by one space."""
    tok = _tokenizer(lang)
    return [tok.tokenize(line, return_str=True, escape=False) for line in lines]


def detokenize(lines: list[str], lang: str) -> list[str]:
    """Moses-detokenise unescaped tokenised ``lines`` (sacremoses ``MosesDetokenizer(lang)``, no unescaping).

    ``Er sagte : " Hallo ! "`` -> ``Er sagte: "Hallo!"``: punctuation attaches, quotes alternate open and close.
    """
    detok = _detokenizer(lang)
    return [detok.detokenize(line.split(), unescape=False) for line in lines]


def tokenizer_name(lang: str) -> str:
    return f"sacremoses MosesTokenizer({lang})"


def detokenizer_name(lang: str) -> str:
    return f"sacremoses MosesDetokenizer({lang})"


@lru_cache(maxsize=8)
def _tokenizer(lang: str):
    from sacremoses import MosesTokenizer  # imported on use: reading a corpus does not need it

    return MosesTokenizer(lang=lang)


@lru_cache(maxsize=8)
def _detokenizer(lang: str):
    from sacremoses import MosesDetokenizer

    return MosesDetokenizer(lang=lang)
