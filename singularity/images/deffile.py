"""Reading an Apptainer definition file back: header keywords and sections.

The rootfs builder builds *from the rendered definition*, not from the spec, so a ``.sif`` and
a bubblewrap root filesystem come from the same text. Only what the builder needs is parsed:
``Key: value`` header lines, and ``%section`` bodies (``%files`` as ``source target`` pairs).
"""
from __future__ import annotations

import shlex
import textwrap
from dataclasses import dataclass, field

SECTIONS = ("setup", "files", "environment", "post", "runscript", "startscript", "test", "labels", "help")


@dataclass
class Definition:
    header: dict[str, str] = field(default_factory=dict)
    sections: dict[str, str] = field(default_factory=dict)

    def files(self) -> list[tuple[str, str]]:
        """``%files`` as (source, target) pairs; a lone source is copied to the same path."""
        pairs = []
        for line in self.sections.get("files", "").splitlines():
            parts = shlex.split(line, comments=True)
            if parts:
                pairs.append((parts[0], parts[1] if len(parts) > 1 else parts[0]))
        return pairs


def parse_definition(text: str) -> Definition:
    definition = Definition()
    current: str | None = None  # the section being read
    body: list[str] = []
    for line in text.splitlines():
        word = line.strip().split(None, 1)[0] if line.strip() else ""
        if word.startswith("%") and word[1:] in SECTIONS:
            _close(definition, current, body)
            current, body = word[1:], []
        elif current is not None:
            body.append(line)
        elif ":" in line and not line.lstrip().startswith("#"):
            key, value = line.split(":", 1)
            definition.header[key.strip().lower()] = value.strip()
    _close(definition, current, body)
    return definition


def _close(definition: Definition, name: str | None, body: list[str]) -> None:
    if name is not None:
        definition.sections[name] = textwrap.dedent("\n".join(body)).strip("\n") + "\n"
