"""Manual pages (roff with the man macros, as ``pod2man`` and the man-pages project write them) to plain prose.

Not a typesetter: the text a reader sees, without the layout. Requests and macros (lines that start with ``.`` or
``'``) are dropped, except those whose arguments are text: headings (``.SH``, ``.SS``), the font macros (``.B``,
``.I``, ``.SM``, ``.SB``, and the alternating ``.BR``, ``.IR``, ``.RB``, ... whose arguments are joined without
spaces), the tags of ``.IP`` and ``.TP`` (the line after ``.TP``), ``.Vb``/``.Ve`` and ``.EX``/``.EE``
listings. Comments (``.\\"``, ``\\"`` to the end of a line), macro definitions (``.de`` ... ``..``), ignored blocks
(``.ig``), conditionals other than nroff's (``.if n`` and ``.ie n`` are read as the request they hold; ``.el``
and any other condition are dropped) and tbl's format lines (from ``.TS``
to the line ending in ``.``) are dropped; a table's data lines are kept, cells separated by tabs.

A line ending in a backslash continues on the next. Text lines are filled as roff fills them: consecutive lines form
one paragraph line, joined with a space; a paragraph macro (``.PP``, ``.LP``, ``.P``, ``.IP``, ``.TP``, ``.SH``,
``.SS``, ``.sp``, ``.br``) ends it. In no-fill mode (``.nf`` ... ``.fi``, ``.EX`` ... ``.EE``, pod2man's ``.Vb`` ...
``.Ve``) lines are kept as they are, so code listings stay as text.

Escapes: font changes (``\\fB``, ``\\f(CW``, ``\\f[I]``), size changes (``\\s+1``), zero-width and spacing marks
(``\\&``, ``\\|``, ``\\^``, ``\\%``, ``\\:``, ``\\c``) are removed; the named characters of :data:`CHARS` (``\\(em``,
``\\[aq]``, ``\\-``, ``\\e``, ...) and pod2man's strings (``\\*(L"``, ``\\*(R"``, ``\\*(--``, ``\\*(C+``) become their
characters; other strings and characters are dropped. A page that is only a ``.so`` link to another page is
empty (the page it names is a document of its own).
"""

from __future__ import annotations

import re

from .clean import squeeze

CHARS = {"em": "\u2014", "en": "\u2013", "hy": "-", "mi": "-", "aq": "'", "dq": '"', "lq": "\u201c",
         "rq": "\u201d", "oq": "\u2018", "cq": "\u2019", "bu": "\u2022", "co": "\u00a9", "rg": "\u00ae",
         "tm": "\u2122", "de": "\u00b0", "+-": "\u00b1", "mu": "\u00d7", "di": "\u00f7", "<=": "\u2264",
         ">=": "\u2265", "!=": "\u2260", "->": "\u2192", "<-": "\u2190", "ti": "~", "ha": "^", "rs": "\\",
         "sl": "/", "ba": "|", "or": "|", "lh": "\u261c", "rh": "\u261e", "sc": "\u00a7", "ps": "\u00b6",
         "fm": "\u2032", "sq": "\u25a1", "pl": "+", "eq": "=", "ga": "`", "aa": "\u00b4", "ul": "_", "ru": "_",
         "bv": "|", "ct": "\u00a2", "Po": "\u00a3", "Eu": "\u20ac", "es": "\u2205", "ne": "\u2262", "if": "\u221e",
         "ss": "\u00df", "'e": "\u00e9", "`e": "\u00e8", ":a": "\u00e4", ":o": "\u00f6", ":u": "\u00fc"}
STRINGS = {'L"': "\u201c", 'R"': "\u201d", "--": "\u2014", "C+": "C++", "C`": "\u2018", "C'": "\u2019",
           "PI": "\u03c0", "Tm": "\u2122", "lq": "\u201c", "rq": "\u201d", "R": "\u00ae"}
FONT_MACROS = frozenset({"B", "I", "SM", "SB"})
ALTERNATING = frozenset({"BR", "RB", "IR", "RI", "BI", "IB"})
BREAKS = frozenset({"PP", "LP", "P", "IP", "TP", "TQ", "HP", "SH", "SS", "sp", "br", "RS", "RE", "in", "ti", "bp",
                    "Sp", "Ip", "Sh", "Vb", "Ve", "EX", "EE", "nf", "fi", "TS", "TE"})
_ESCAPE = re.compile(r"""\\(?:
      f(?:\[[^\]]*\]|\(..|.)            # font
    | s[-+]?(?:\d+|\(\d\d|\[\d+\])      # size
    | \*(?:\[(?P<long>[^\]]*)\]|\((?P<two>..)|(?P<one>.))   # string
    | \[(?P<named>[^\]]*)\]             # named character
    | \((?P<char>..)                    # two-letter character
    | [kmn](?:\[[^\]]*\]|\(..|.)        # mark, colour, register
    | [hvwoxlLDNbCSZXY]'[^']*'          # motions, widths, and other delimited escapes
    | (?P<plain>.)                      # one character
)""", re.VERBOSE)
_PLAIN = {"-": "-", "e": "\\", "\\": "\\", " ": " ", "0": " ", "~": " ", "t": "\t", ".": ".", "'": "\u00b4",
          "`": "`", "_": "_"}
_ARGS = re.compile(r'"((?:[^"]|"")*)"|(\S+)')


def man_to_text(page: str) -> str:
    """The prose of a manual page (see the module docstring): one line a paragraph, listings kept."""
    out: list[str] = []
    filled: list[str] = []
    nofill = tbl_format = tag_next = False
    skip_until = ""  # the line that ends a .de / .ig block

    def end_paragraph() -> None:
        if filled:
            out.append(" ".join(filled))
            filled.clear()

    lines = re.sub(r"(?<!\\)\\\n", "", page).split("\n")  # an escaped newline continues the line
    if all(not ln.strip() or ln.startswith((".so ", ".\\\"", "'\\\"")) for ln in lines) and any(
            ln.startswith(".so ") for ln in lines):
        return ""
    for raw in lines:
        if skip_until:
            if raw.strip() == skip_until:
                skip_until = ""
            continue
        if tbl_format:  # tbl's options and format lines, up to the one ending in "."
            tbl_format = not raw.rstrip().endswith(".")
            continue
        if raw.startswith((".", "'")) and not (nofill and raw.startswith("'")):
            name, args = _request(raw)
            if name in ("if", "ie") and args[:1] == ["n"] and args[1].startswith("."):  # the nroff branch
                name, args = _request(args[1])
            if name in ("de", "de1", "am", "ig"):
                skip_until = ".." if name != "ig" or not args else "." + args[0]
                continue
            if name in BREAKS:
                end_paragraph()
            if name in ("TP", "TQ"):
                tag_next = True
                continue
            if name in ("nf", "EX", "Vb"):
                nofill = True
            elif name in ("fi", "EE", "Ve"):
                nofill = False
            elif name == "TS":
                tbl_format, nofill = True, True
            elif name == "TE":
                nofill = False
            text = ""
            if name in ("SH", "SS", "Sh") or name in FONT_MACROS:
                text = " ".join(args)
            elif name in ALTERNATING:
                text = "".join(args)
            elif name in ("IP", "Ip", "HP") and args:
                text = args[0]
            text = _inline(text).strip()
            if text:
                if name in ("SH", "SS", "Sh", "IP", "Ip", "HP") or tag_next:
                    out.append(text)
                    tag_next = False
                elif nofill:
                    out.append(text)
                else:
                    filled.append(text)
            continue
        text = _inline(raw)
        if tag_next and text.strip():
            out.append(text.strip())
            tag_next = False
        elif nofill:
            out.append(text.rstrip())
        elif text.strip():
            filled.append(text.strip())
        else:
            end_paragraph()
    end_paragraph()
    return "\n".join(squeeze(out)).strip("\n")


def _request(line: str) -> tuple[str, list[str]]:
    """The name of a request line and its arguments (quoted ones unquoted, a comment cut)."""
    body = line[1:].split('\\"', 1)[0].strip()
    name, _, rest = body.partition(" ")
    if name in ("if", "ie", "el"):  # [condition, what follows it]: only nroff's branch ("n") is read
        cond, _, then = rest.strip().partition(" ")
        return name, [cond, then.strip()]
    args = [(m.group(1).replace('""', '"') if m.group(1) is not None else m.group(2)) for m in _ARGS.finditer(rest)]
    return name, args


def _inline(text: str) -> str:
    """``text`` with its escapes resolved (see the module docstring) and its comment cut."""
    text = text.split('\\"', 1)[0]
    return _ESCAPE.sub(_escape, text)


def _escape(m: re.Match) -> str:
    if m.group("long") is not None or m.group("two") is not None or m.group("one") is not None:
        return STRINGS.get(m.group("long") or m.group("two") or m.group("one"), "")
    named = m.group("named") or m.group("char")
    if named is not None:
        return CHARS.get(named, "")
    plain = m.group("plain")
    return _PLAIN.get(plain, "") if plain is not None else ""

