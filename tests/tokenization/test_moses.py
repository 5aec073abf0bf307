"""Moses conventions: the escaped special characters, the tokenizer and the detokenizer (sacremoses)."""

import html

import pytest

from skiplab.tokenization import moses


@pytest.mark.parametrize("entity", list(moses.ENTITIES))
def test_each_entity_unescapes_to_its_character(entity):
    assert moses.unescape(f"a {entity} b") == f"a {moses.ENTITIES[entity]} b"


def test_unescape_undoes_the_moses_escaper_and_agrees_with_html_on_its_entities():
    from sacremoses import MosesTokenizer

    raw = "Tom's \"Haus\" & <Anna> [sic] a|b &quot; &amp;"  # the last two are literal text, escaped in turn
    escaped = MosesTokenizer(lang="en").escape_xml(raw)
    assert "&amp;quot;" in escaped and "&#124;" in escaped
    assert moses.unescape(escaped) == raw == html.unescape(escaped)


def test_unescape_leaves_other_ampersands_alone():
    # html.unescape would turn these into "©" and "é"; Moses never escapes them, so they are text.
    assert moses.unescape("&copy 2014 &eacute; AT&T &#65;") == "&copy 2014 &eacute; AT&T &#65;"
    assert html.unescape("&copy 2014") == "© 2014"
    assert moses.unescape("&bar; &bra; &ket;") == "| [ ]"  # the older forms deescape-special-chars.perl reads


def test_detokenizer_on_a_moses_tokenised_sentence_with_escaped_quotes():
    line = "Er sagte : &quot; Hallo , Welt ! &quot; und ging &#91; schnell &#93; nach Hause ."
    assert moses.detokenize([moses.unescape(line)], "de") == ['Er sagte: "Hallo, Welt!" und ging [schnell] nach Hause.']
    assert moses.detokenize(["It &apos;s Tom &apos;s ."], "en") == ["It &apos;s Tom &apos;s."]  # entities: not its job
    assert moses.detokenize([moses.unescape("It &apos;s Tom &apos;s .")], "en") == ["It's Tom's."]


def test_tokenizer_splits_punctuation_without_escaping():
    assert moses.tokenize(['Er sagte: "Hallo, Welt!" & ging.'], "de") == ['Er sagte : " Hallo , Welt ! " & ging .']
    assert moses.tokenize(["Tom's dog."], "en") == ["Tom 's dog ."]
    assert moses.detokenize(moses.tokenize(['Er sagte: "Hallo, Welt!"'], "de"), "de") == ['Er sagte: "Hallo, Welt!"']
    assert moses.tokenizer_name("de") == "sacremoses MosesTokenizer(de)"
    assert moses.detokenizer_name("de") == "sacremoses MosesDetokenizer(de)"
