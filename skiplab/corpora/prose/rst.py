"""reStructuredText sources to plain prose: the text a reader sees, without the markup.

- Section adornments (a line of one repeated punctuation character, ``=====``, ``-----``, ``~~~~``) are dropped;
  the title they adorn stays.
- Explicit markup: a comment, a hyperlink target (``.. _label:``) or a substitution definition is dropped with its
  indented block; a directive (``.. name:: argument``) is dropped with its options (``:maxdepth: 2``), and its
  indented content is kept as text (the body of a ``note``, the code of a ``code-block``), except for the
  directives of :data:`DROP_DIRECTIVES` (``toctree``, ``image``, ``kernel-doc``, ...), whose content is not prose.
- A paragraph that ends in ``::`` introduces a literal block: the ``::`` becomes ``:`` (a lone ``::`` line goes),
  as docutils renders it, and the block is kept.
- Inline markup: roles (``:c:func:`PyList_New```) keep their text (``PyList_New``), an explicit title and target
  (``:ref:`the guide <guide>```) keep the title; ````literal````, ``*emphasis*``, ``**strong**``, hyperlink
  references (```text <url>`_``, ```text`_``, ``word_``) keep their text; footnote references (``[#]_``, ``[1]_``)
  go.
- Line blocks and tables are kept as they are written (a grid table's rules are dropped, its cells stay).
"""

from __future__ import annotations

import re

from .clean import squeeze

DROP_DIRECTIVES = frozenset({"toctree", "image", "figure", "kernel-doc", "kernel-abi", "kernel-feat",
                             "kernel-include", "include", "literalinclude", "raw", "only", "index", "contents",
                             "sectnum", "highlight", "default-role", "role", "meta", "cssclass", "tabularcolumns",
                             "automodule", "autoclass", "autofunction", "csv-table", "graphviz", "math"})
_ADORNMENT = re.compile(r"^([=\-~^\"'`#*+_:.<>])\1{2,}\s*$")
_GRID_RULE = re.compile(r"^\s*\+[-=+]+\+\s*$|^\s*[=\- ]{3,}$")
_EXPLICIT = re.compile(r"^(\s*)\.\.(?:\s+|$)(.*)$")
_DIRECTIVE = re.compile(r"^([\w:.+-]+)::(.*)$")
_OPTION = re.compile(r"^\s*:[\w\s-]+:(\s|$)")
_ROLE = re.compile(r":[\w.+:-]+:`((?:[^`\\]|\\.)+)`")
_TITLED = re.compile(r"^(.*?)\s*<[^<>]+>$", re.DOTALL)
_LITERAL = re.compile(r"``(.+?)``")
_LINK = re.compile(r"`([^`]+?)`__?")
_STRONG = re.compile(r"\*\*(\S(?:.*?\S)?)\*\*")
_EMPHASIS = re.compile(r"(?<![\w*])\*(\S(?:.*?\S)?)\*(?![\w*])")
_FOOTNOTE = re.compile(r"\s?\[(?:#\w*|\d+|\*)\]_")
_WORD_LINK = re.compile(r"(?<!\w)([A-Za-z0-9]+(?:[-.][A-Za-z0-9]+)*)_(?!\w)")


def rst_to_text(source: str) -> str:
    """The prose of a reStructuredText document (see the module docstring)."""
    out: list[tuple[str, bool]] = []  # (line, literal): inline markup is resolved on the prose lines only
    lines = source.expandtabs(8).split("\n")
    literal_after = -1  # the indentation that a literal block (after "::") must exceed; -1: none open
    i = 0
    while i < len(lines):
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        if literal_after >= 0 and line.strip() and indent <= literal_after:
            literal_after = -1
        if literal_after >= 0:
            out.append((line, True))
            i += 1
            continue
        m = _EXPLICIT.match(line)
        if m:
            d = _DIRECTIVE.match(m.group(2))
            end = _block_end(lines, i + 1, len(m.group(1)))
            if d and d.group(1).split(":")[-1] not in DROP_DIRECTIVES:
                code = d.group(1).split(":")[-1] in ("code-block", "code", "sourcecode", "parsed-literal")
                if d.group(2).strip() and not code:  # a code block's argument is its language
                    out.append((d.group(2).strip(), False))
                content = lines[i + 1 : end]
                while content and (_OPTION.match(content[0]) or not content[0].strip()):
                    content.pop(0)
                out.extend((ln, code) for ln in _dedent(content))
            i = end
            continue
        i += 1
        if _ADORNMENT.match(line) or (line.strip() and _GRID_RULE.match(line)):
            continue
        stripped = line.rstrip()
        if stripped.endswith("::"):
            literal_after = indent
            stripped = stripped[:-1] if stripped.strip() != "::" else ""
        out.append((stripped, False))
    text: list[str] = []
    j = 0
    while j < len(out):  # each run of prose lines at once, so markup that spans lines resolves
        k = j
        while k < len(out) and out[k][1] == out[j][1]:
            k += 1
        run = "\n".join(line for line, _ in out[j:k])
        text.extend((run if out[j][1] else _inline(run)).split("\n"))
        j = k
    return "\n".join(squeeze(text)).strip("\n")


def _block_end(lines: list[str], start: int, indent: int) -> int:
    """The index after the block that starts at ``start``: lines indented past ``indent``, or blank."""
    j = start
    while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent):
        j += 1
    while j > start and not lines[j - 1].strip():  # trailing blank lines belong to what follows
        j -= 1
    return j


def _dedent(block: list[str]) -> list[str]:
    widths = [len(ln) - len(ln.lstrip()) for ln in block if ln.strip()]
    cut = min(widths) if widths else 0
    return [ln[cut:] for ln in block]


def _inline(text: str) -> str:
    text = _ROLE.sub(lambda m: _title(m.group(1)), text)
    text = _LITERAL.sub(r"\1", text)
    text = _LINK.sub(lambda m: _title(m.group(1)), text)
    text = _STRONG.sub(r"\1", text)
    text = _EMPHASIS.sub(r"\1", text)
    text = _FOOTNOTE.sub("", text)
    return _WORD_LINK.sub(r"\1", text)


def _title(target: str) -> str:
    """A role's or link's text: the title of ``title <target>``, else the target (``~`` and ``!`` prefixes off)."""
    m = _TITLED.match(target)
    return m.group(1) if m and m.group(1) else target.lstrip("~!")

