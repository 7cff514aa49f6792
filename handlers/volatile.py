"""Fields that an agent's own tools make different on every run (a fresh id, a duration), named
by the handler so that a resume's observation check can look past them and nothing else.

A handler declares them (``EndpointRequest.volatile_fields``: the harnesses'
declarations are in ``handlers.agent_program.harnesses``); the journal's replay check
(``prorl_celery.llm.journal``) replaces each match by the field's placeholder in both the
journaled and the replayed observation before comparing them. Only text that matches a
declared pattern is replaced: any other difference still stops the replay.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class VolatileField:
    """One field of a tool's output that is new on every run, as a regular expression.

    ``pattern`` is matched with ``re.MULTILINE`` (so ``^`` and ``$`` anchor a line), and its
    whole match is replaced by ``<name>``: keep it as narrow as the tool's own format, since
    whatever it matches is never compared."""

    name: str
    pattern: str
    _compiled: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # compiled once: a resume normalises every replayed observation of the job
        object.__setattr__(self, "_compiled", re.compile(self.pattern, re.MULTILINE))

    @property
    def placeholder(self) -> str:
        return f"<{self.name}>"

    def replace(self, text: str) -> str:
        return self._compiled.sub(self.placeholder, text)


def normalise(text: str, fields: Iterable[VolatileField]) -> str:
    """``text`` with every match of each field replaced by its placeholder."""
    for volatile in fields:
        text = volatile.replace(text)
    return text
