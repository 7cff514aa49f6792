"""Layout helpers built on ``wrap``."""
from wraptext.wrap import wrap


def indent(text, prefix, first_prefix=None):
    """Prefix every non-empty line; ``first_prefix`` (a bullet, say) replaces it on line one."""
    out = []
    for number, line in enumerate(text.split("\n")):
        lead = first_prefix if number == 0 and first_prefix is not None else prefix
        out.append(lead + line if line.strip() else line)
    return "\n".join(out)


def shorten(text, width, placeholder=" [...]"):
    """Collapse whitespace and cut at a word boundary so the result fits ``width``."""
    words = text.split()
    if len(" ".join(words)) <= width:
        return " ".join(words)
    kept = ""
    for word in words:
        candidate = f"{kept} {word}" if kept else word
        if len(candidate) + len(placeholder) > width:
            break
        kept = candidate
    return (kept + placeholder).strip()


def columns(left, right, width=40, gap=2):
    """Two texts side by side, each wrapped to ``width``."""
    a, b = wrap(left, width), wrap(right, width)
    rows = max(len(a), len(b))
    a += [""] * (rows - len(a))
    b += [""] * (rows - len(b))
    return "\n".join((x.ljust(width) + " " * gap + y).rstrip() for x, y in zip(a, b))
