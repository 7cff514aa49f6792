"""Greedy wrapping: as many words per line as fit in ``width`` characters."""


def wrap(text, width=70):
    """Split ``text`` into lines of at most ``width`` characters.

    Runs of whitespace collapse to one space; a word longer than ``width`` is cut into pieces
    of ``width`` characters.
    """
    if width < 1:
        raise ValueError(f"width must be at least 1, got {width}")
    lines = []
    current = ""
    for word in text.split():
        while len(word) > width:
            if current:
                lines.append(current)
                current = ""
            lines.append(word[:width])
            word = word[width:]
        if not current:
            current = word
        elif len(current) + 1 + len(word) < width:
            current += " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


def fill(text, width=70):
    """``wrap`` joined with newlines."""
    return "\n".join(wrap(text, width))
