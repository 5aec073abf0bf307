"""Documentation files to prose: HTML, manual pages, reStructuredText, and the cleaning every result gets."""

import gzip

import pytest

from skiplab.corpora.prose import clean, decode, html_to_text, man_to_text, rst_to_text, text_key, to_text
from skiplab.corpora.prose.clean import drop_number_tables, is_numeric_line


def test_html_keeps_the_main_content_only_when_the_page_marks_it():
    page = """<html><head><title>T</title><style>p {}</style></head><body>
    <nav>Home | Up</nav><div class="sphinxsidebar">Search</div>
    <div role="main"><h1>Title<a class="headerlink" href="#t">¶</a></h1>
    <p>One   paragraph,
       folded &amp; <b>bold</b>.<p>Another, left open.</div>
    <div class="footer">Copyright</div></body></html>"""
    assert html_to_text(page) == "Title\nOne paragraph, folded & bold.\nAnother, left open."


def test_html_without_a_main_keeps_the_body_but_not_its_navigation():
    page = """<body><div class="navheader">Prev Next</div><div id="header"><h1>git-x(1)</h1></div>
    <div id="toc">1. Intro</div><p>Text<br>broken</p><script>var x = 1;</script>
    <pre>  code
    indented

  end</pre><table><tr><th>a</th><td>b</td></tr></table><div class="navfooter">Prev</div></body>"""
    assert html_to_text(page) == "git-x(1)\nText\nbroken\n  code\n    indented\n\n  end\na\tb"


def test_html_ignores_a_closing_tag_it_never_opened():
    assert html_to_text("<body><p>a</span>b</p></div><p>c</p></body>") == "ab\nc"


MAN = r""".\" a comment
.de Sp
.sp
..
.TH FOO 1
.SH "NAME"
foo \- do a thing
.SH DESCRIPTION
.B foo
reads
.I files
and writes\(emquickly\[em]with \fBbold\fR and \f(CWcode\fP.
A second line, \*(L"quoted\*(R".
.PP
.TP
.BR \-v , " \-\-verbose"
Say more.
.ie n .IP "$x = \fBf()\fR" 4
.el .IP "troff only" 4
An item.
.nf
  int x;
    return x;
.fi
Filled \
again.
"""


def test_man_fills_paragraphs_and_keeps_headings_tags_and_listings():
    assert man_to_text(MAN) == (
        "NAME\nfoo - do a thing\nDESCRIPTION\n"
        "foo reads files and writes\u2014quickly\u2014with bold and code. A second line, \u201cquoted\u201d.\n"
        "-v, --verbose\nSay more.\n$x = f()\nAn item.\n  int x;\n    return x;\nFilled again.")


def test_a_man_page_that_only_links_to_another_is_empty():
    assert man_to_text('.\\" link\n.so man3/printf.3\n') == ""


RST = """Title
=====

Some :c:func:`foo <bar>`, ``x``, *em*, **strong** and link_ text [#]_.
A `link spanning
two lines <http://example.org>`_ ends.

Example::

    code *kept*

Back.

.. toctree::
   :maxdepth: 2

   intro

.. note::
   A note body.

.. code-block:: c

   int *p;

.. _label:

.. kernel-doc:: include/x.h

End."""


def test_rst_keeps_prose_and_code_without_markup():
    assert rst_to_text(RST) == (
        "Title\n\nSome foo, x, em, strong and link text.\nA link spanning\ntwo lines ends.\n\nExample:\n\n"
        "    code *kept*\n\nBack.\n\nA note body.\n\nint *p;\n\nEnd.")


def test_tables_of_numbers_go_but_a_number_in_prose_stays():
    lines = ["The registers:", "0x00 0x1f 12 7", "0x04 0xff 13 8", "0x08 0x3c 14 9", "Prose with 1 2 3 numbers.",
             "1 2 3 4"]
    assert drop_number_tables(lines) == ["The registers:", "Prose with 1 2 3 numbers.", "1 2 3 4"]
    assert is_numeric_line("10.5% 3:20 -7 [0]") and not is_numeric_line("use 1 or 2 arguments")
    assert not is_numeric_line("1 2")  # too few tokens to be a table's row
    assert clean("\n\na\n\n\n\nb  \n\n") == "a\n\nb"


def test_text_key_ignores_case_whitespace_and_compatibility_forms():
    assert text_key("Hello  World\n") == text_key("hello world") == text_key("ｈｅｌｌｏ world")
    assert text_key("hello world") != text_key("hello, world")


def test_decode_reads_gzip_utf8_and_latin1_and_refuses_binary():
    assert decode(gzip.compress("é\r\nx".encode())) == "é\nx"
    assert decode(b"caf\xe9") == "café" and decode("\ufeffok".encode()) == "ok"
    assert decode(b"\x7fELF\x00\x01") is None
    assert to_text("html", b"PNG\x00\x00") == ""
    with pytest.raises(ValueError, match="unknown document kind 'pdf'; known: html, man, rst, txt"):
        to_text("pdf", b"")
