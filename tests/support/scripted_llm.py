"""A ChatLLM for handler tests that starts no process: scripted reply texts, one token per
character."""
from __future__ import annotations

from typing import Any

from handlers.base import Generation


class ScriptedLLM:
    """A ChatLLM that replies with scripted texts and counts one token per character."""

    def __init__(self, replies: list[str], context_length: int = 100_000):
        self.replies = list(replies)
        self.context_length = context_length
        self._messages: list[dict[str, Any]] = []
        self._turns = 0
        self.started = False

    def start(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
              ) -> None:
        assert not self.started, "start() called twice"
        self.started = True
        self._messages = [dict(m) for m in messages]

    async def generate(self, **sampling_overrides: Any) -> Generation:
        assert self.started, "generate() before start()"
        text = self.replies.pop(0)
        self._messages.append({"role": "assistant", "content": text})
        self._turns += 1
        return Generation(text=text, token_ids=[ord(c) for c in text], logprobs=[0.0] * len(text),
                          finish_reason="stop")

    def add_message(self, role: str, content: str, **fields: Any) -> None:
        self._messages.append({"role": role, "content": content, **fields})

    def note_action(self, name: str | None, arguments: Any) -> None:
        self.actions = [*getattr(self, "actions", []), (name, arguments)]

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self._messages)

    @property
    def num_turns(self) -> int:
        return self._turns

    @property
    def context_left(self) -> int:
        return self.context_length - sum(len(m["content"]) for m in self._messages)
