"""The service's tokenizer: chat-template rendering and observation suffixes.

Earlier turns are never re-tokenized. A new observation is tokenized by rendering a fixed
probe conversation with and without it and keeping only the text after the probe's last
end-of-turn token: templates that rewrite earlier turns (Qwen3 drops old ``<think>`` blocks)
cannot change what lies after that token.
"""
from __future__ import annotations

import json
import threading
from functools import lru_cache
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

_PROBE = [{"role": "user", "content": "probe"}, {"role": "assistant", "content": "probe"}]


class ChatTokenizer:
    """A Hugging Face tokenizer with the operations a token-level trajectory needs."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, name: str = "") -> None:
        if tokenizer.chat_template is None:
            raise ValueError(f"tokenizer {name!r} has no chat template")
        self.hf = tokenizer
        self.name = name
        self.eot_token: str = tokenizer.eos_token
        self.eot_id: int = tokenizer.convert_tokens_to_ids(self.eot_token)
        # the Rust tokenizer raises "Already borrowed" when one instance is used by two threads
        self._lock = threading.Lock()
        self._probe_cache: dict[str, int] = {}

    def render(self, messages: list[dict[str, Any]], tools: list[dict] | None = None,
               add_generation_prompt: bool = False) -> str:
        with self._lock:
            return self.hf.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
            )

    def encode(self, text: str) -> list[int]:
        """Ids of text that already carries its special tokens (rendered by the template)."""
        with self._lock:
            return self.hf.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        with self._lock:
            return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> list[int]:
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def message_ends(self, messages: list[dict[str, Any]], prompt_ids: list[int],
                     tools: list[dict] | None = None) -> list[int]:
        """Where each first message's tokens end in ``prompt_ids``; the last one ends with the
        generation prompt. A message whose own rendering is not a token prefix of the prompt
        (a template that adds a preamble only once it sees later turns) shares the next
        message's end, so every token still belongs to exactly one message."""
        ends = []
        for count in range(1, len(messages)):
            ids = self.encode(self.render(messages[:count], tools))
            prefix = len(ids) if prompt_ids[:len(ids)] == ids else -1
            ends.append(prefix)
        ends.append(len(prompt_ids))
        for index in range(len(ends) - 2, -1, -1):  # an unmatched end takes the next one
            if ends[index] < 0 or ends[index] > ends[index + 1]:
                ends[index] = ends[index + 1]
        return ends

    def observation_ids(self, message: dict[str, Any], tools: list[dict] | None = None) -> list[int]:
        """Ids to append after a model turn that ended with the end-of-turn token."""
        turns = self._probe_turns(tools)
        after = self.render(_PROBE + [message], tools, add_generation_prompt=True)
        cut = _nth_end(after, self.eot_token, turns)
        if turns == 0 or cut < 0:
            raise ValueError(f"chat template of {self.name!r} has no {self.eot_token!r} after a turn")
        return self.encode(after[cut:])


    def _probe_turns(self, tools: list[dict] | None) -> int:
        """End-of-turn tokens in the rendered probe; it depends only on the tools, so it is
        rendered once per tool set rather than once per observation."""
        key = json.dumps(tools, sort_keys=True)
        if key not in self._probe_cache:
            self._probe_cache[key] = self.render(_PROBE, tools).count(self.eot_token)
        return self._probe_cache[key]


def _nth_end(text: str, token: str, n: int) -> int:
    """Index just after the n-th occurrence of token in text, or -1."""
    index = -1
    for _ in range(n):
        index = text.find(token, index + 1)
        if index < 0:
            return -1
    return index + len(token)


_load_lock = threading.Lock()


def load_tokenizer(path: str) -> ChatTokenizer:
    """Load (once per process) a tokenizer from a local directory; never from a hub."""
    with _load_lock:  # threads asking at once must not each spend seconds loading it
        return _load(path)


@lru_cache(maxsize=16)
def _load(path: str) -> ChatTokenizer:
    return ChatTokenizer(AutoTokenizer.from_pretrained(path, local_files_only=True), name=path)
