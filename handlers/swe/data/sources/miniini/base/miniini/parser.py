"""Read INI text into ``{section: {key: value}}`` (all strings, keys lower-cased)."""
from miniini.errors import ParseError

COMMENT_PREFIXES = ("#", ";")


def _unquote(value):
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def loads(text):
    """Parse INI ``text``; raise ParseError (with the line number) on malformed input.

    Keys before the first section header go to the ``""`` section. A repeated section
    extends the earlier one; a repeated key overrides it.
    """
    config = {}
    section = ""
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(COMMENT_PREFIXES):
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise ParseError(lineno, f"unterminated section header {line!r}")
            section = line[1:-1].strip()
            if not section:
                raise ParseError(lineno, "empty section name")
            config.setdefault(section, {})
            continue
        if "=" in line:
            key, value = line.split("=")
        elif ":" in line:
            key, value = line.split(":", 1)
        else:
            raise ParseError(lineno, f"expected 'key = value', got {line!r}")
        key = key.strip().lower()
        if not key:
            raise ParseError(lineno, "empty key")
        config.setdefault(section, {})[key] = _unquote(value.strip())
    return config
