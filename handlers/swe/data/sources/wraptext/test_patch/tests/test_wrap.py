import pytest

from wraptext import fill, wrap


def test_wrap_basic():
    assert wrap("The quick brown fox jumps over the lazy dog", width=16) == [
        "The quick brown", "fox jumps over", "the lazy dog"]


def test_whitespace_collapses():
    assert wrap("  one \n two\tthree  ", width=40) == ["one two three"]


def test_long_words_are_cut():
    assert wrap("abcdefghij xy", width=4) == ["abcd", "efgh", "ij", "xy"]


def test_empty_text():
    assert wrap("   ", width=10) == []


def test_bad_width():
    with pytest.raises(ValueError):
        wrap("x", width=0)


def test_fill():
    assert fill("one two three four", width=9) == "one two\nthree\nfour"


def test_a_line_may_fill_the_width_exactly():
    assert wrap("aaa bbb ccc", width=7) == ["aaa bbb", "ccc"]
    assert fill("ab cd ef gh", width=5) == "ab cd\nef gh"


@pytest.mark.parametrize("width", [8, 11, 16, 23])
def test_matches_the_standard_library(width):
    import textwrap
    text = "Sphinx of black quartz judge my vow while five boxing wizards jump quickly"
    assert wrap(text, width) == textwrap.wrap(text, width)
