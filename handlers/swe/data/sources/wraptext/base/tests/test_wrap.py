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
