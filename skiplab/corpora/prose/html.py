"""HTML pages to plain prose: the text of a page's main content, one paragraph a block.

What is kept: where the page marks its main content (an element with ``role="main"`` or a ``<main>``, as Sphinx's
themes do), only that element's text; elsewhere the whole ``<body>``. In either, the elements that are not prose are
left out: ``<script>``, ``<style>``, ``<nav>``, ``<header>``, ``<footer>``, forms, and the navigation that the
documentation generators write as ``<div>``\\ s (those whose class or id is one of :data:`DROP_NAMES`: DocBook's
``navheader``/``navfooter``, Sphinx's ``sphinxsidebar``, ``related`` and ``headerlink`` anchors, asciidoc's ``toc``
and ``footer``, Sphinx's local ``contents``, SQLite's ``nosearch`` header, Node.js's ``column2`` and ``#`` ``mark``
anchors, ...). Block elements (:data:`BLOCKS`) end a line, so a paragraph, heading, list item or table row is a line
of its own; the text inside a block has its whitespace collapsed to single spaces, as a browser shows it, except in
``<pre>``, whose lines are kept as they are (code listings stay as text). Table cells are separated by a tab.
Character references are decoded (Python's :class:`html.parser.HTMLParser` with ``convert_charrefs``).

The parser is forgiving, as pages are: a closing tag closes every element opened after its match (a ``<p>`` or
``<li>`` left open inside a ``<div>`` ends with it), a closing tag with no open match is ignored, and void elements
(``<br>``, ``<img>``, ...) open nothing.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

BLOCKS = frozenset({"address", "article", "aside", "blockquote", "br", "caption", "dd", "details", "div", "dl", "dt",
                    "figcaption", "figure", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "li", "main", "ol", "p", "pre",
                    "section", "summary", "table", "tbody", "tfoot", "thead", "title", "tr", "ul"})
VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
                  "track", "wbr"})
SKIP_TAGS = frozenset({"script", "style", "nav", "header", "footer", "form", "button", "select", "noscript", "svg",
                       "head", "template", "iframe", "object"})
# class or id values of the navigation that documentation generators write as ordinary elements
DROP_NAMES = frozenset({"navheader", "navfooter", "navigation", "footer", "sphinxsidebar", "sphinxsidebarwrapper",
                        "related", "headerlink", "toc", "toctitle", "breadcrumbs", "leftnav", "topbar", "searchbox",
                        "global-nav", "hd", "ft", "nav", "rst-footer-buttons", "wy-nav-side", "contents",
                        "nosearch", "fancy-toc1", "fancy-toc2", "fancy_toc_mark", "gtoc", "column2", "mark"})
_SPACE = re.compile(r"[ \t\n\r\f\v]+")
_MAIN = re.compile(r"""<main[\s>]|role\s*=\s*["']?main\b""", re.IGNORECASE)


def html_to_text(page: str) -> str:
    """The prose of an HTML page (see the module docstring): paragraphs on their own lines, blank lines only
    where a ``<pre>`` has them, no markup."""
    parser = _Prose(main_only=bool(_MAIN.search(page)))
    parser.feed(page)
    parser.close()
    return parser.text()


class _Prose(HTMLParser):
    def __init__(self, main_only: bool) -> None:
        super().__init__(convert_charrefs=True)
        self.main_only = main_only
        self.stack: list[tuple[str, bool, bool]] = []  # (tag, skipped, main) of each open element
        self.skip = 0  # open elements that are not prose
        self.main = 0  # open main-content elements
        self.pre = 0
        self.lines: list[str] = []
        self.line: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in BLOCKS:
            self._end_line()
        elif tag in ("td", "th"):
            self.line.append("\t")
        if tag in VOID:
            return
        names = {v for k, value in attrs if k in ("class", "id") and value for v in value.split()}
        skipped = tag in SKIP_TAGS or bool(names & DROP_NAMES)
        main = tag == "main" or any(k == "role" and v == "main" for k, v in attrs)
        self.stack.append((tag, skipped, main))
        self.skip += skipped
        self.main += main
        self.pre += tag == "pre"

    def handle_endtag(self, tag: str) -> None:
        if not any(t == tag for t, _, _ in self.stack):
            return
        while self.stack:
            t, skipped, main = self.stack.pop()
            if t in BLOCKS:  # before leaving a <pre>: its last line keeps its indentation
                self._end_line()
            self.skip -= skipped
            self.main -= main
            self.pre -= t == "pre"
            if t == tag:
                break

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in BLOCKS:
            self._end_line()

    def handle_data(self, data: str) -> None:
        if self.skip or (self.main_only and not self.main):
            return
        if self.pre:
            lines = data.split("\n")
            self.line.append(lines[0])
            for line in lines[1:]:
                self._end_line(keep_blank=True)
                self.line.append(line)
        else:
            self.line.append(_SPACE.sub(" ", data))

    def _end_line(self, keep_blank: bool = False) -> None:
        text = "".join(self.line)
        self.line = []
        if not self.pre:
            text = text.strip(" ")
        text = text.rstrip()
        if text.strip("\t ") or (keep_blank and self.lines and self.lines[-1]):
            self.lines.append(text.strip("\t") if not self.pre else text)

    def text(self) -> str:
        self._end_line()
        return "\n".join(self.lines).strip("\n")
