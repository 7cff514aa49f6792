import pytest

from dialects import Dialect, sniff


@pytest.mark.parametrize("delimiter", [",", ";", "\t", "|"])
def test_delimiter(delimiter):
    sample = delimiter.join(["name", "age", "city"]) + "\n" + delimiter.join(["ann", "31", "Oslo"])
    assert sniff(sample).delimiter == delimiter


def test_delimiter_inside_quotes_is_ignored():
    sample = 'name;note\n"Smith, John";"a, b, c"\n"Doe, Jane";"d"'
    assert sniff(sample).delimiter == ";"


def test_single_quotes():
    sample = "id,label\n1,'x, y'\n2,'z'"
    assert sniff(sample) == Dialect(delimiter=",", quotechar="'", has_header=True)


def test_header_detection():
    assert sniff("name|age\nann|31\nbob|27").has_header
    assert not sniff("ann|31\nbob|27").has_header


def test_inconsistent_sample_falls_back_to_comma():
    assert sniff("a;b\nc;d;e").delimiter == ","


@pytest.mark.parametrize("ending", ["\n", "\r\n", "\r"])
def test_line_endings_and_trailing_newline(ending):
    sample = ending.join(["name;age", "ann;31", "bob;27"]) + ending
    assert sniff(sample) == Dialect(delimiter=";", quotechar='"', has_header=True)


def test_blank_lines_are_ignored():
    assert sniff("a|b\n\n1|2\n\n").delimiter == "|"
