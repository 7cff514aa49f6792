"""Code blocks of the docs, for the tests that run them as written."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: an HTML comment right before a block that a page's test does not run, with the reason
NOT_RUN = "<!-- not run by the test"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    language: str
    code: str
    run: bool  # False: marked with NOT_RUN, the reason in the comment
    line: int  # 1-based line of the opening fence


def code_blocks(path: Path, language: str | None = None) -> list[Block]:
    """The fenced blocks of a page (of one language), in order."""
    text = path.read_text()
    blocks = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip().splitlines()
        marked = bool(before) and before[-1].startswith(NOT_RUN)
        if language is None or match.group(1) == language:
            blocks.append(Block(match.group(1), match.group(2), not marked, text.count("\n", 0, match.start()) + 1))
    return blocks


#: an HTML comment right before a block that is a whole file of the checkout, or a part of one
SHOWS = re.compile(r"^<!-- (example|excerpt): (\S+) -->$")


def shown_files(path: Path) -> list[tuple[str, str, Block]]:
    """``(kind, file, block)`` for each block marked as a file's content (``example``) or a part
    of it (``excerpt``)."""
    text = path.read_text()
    shown = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip().splitlines()
        marker = SHOWS.match(before[-1]) if before else None
        if marker:
            block = Block(match.group(1), match.group(2), False, text.count("\n", 0, match.start()) + 1)
            shown.append((marker.group(1), marker.group(2), block))
    return shown


def page_script(path: Path, replacements: dict[str, str]) -> str:
    """The page's bash blocks that a test runs, as one script: strict, each block announced, curl
    failing on an HTTP error status (the body still shown), each replacement applied."""
    script = "set -euo pipefail\ncurl() { command curl --fail-with-body \"$@\"; }\n"
    for block in code_blocks(path, "bash"):
        if block.run:
            code = block.code
            for old, new in replacements.items():
                code = code.replace(old, new)
            script += f"echo '### {path.name}, block at line {block.line}'\n{code}"
    return script
