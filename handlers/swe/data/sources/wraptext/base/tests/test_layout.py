from wraptext import columns, indent, shorten


def test_indent():
    assert indent("a\n\nb", "  ") == "  a\n\n  b"
    assert indent("a\nb", "  ", first_prefix="- ") == "- a\n  b"


def test_shorten():
    assert shorten("Hello   world", 20) == "Hello world"
    assert shorten("The quick brown fox jumps", 15) == "The quick [...]"


def test_columns():
    assert columns("left side text", "right", width=10, gap=1) == "left side  right\ntext"
