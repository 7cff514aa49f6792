"""Token-in/token-out conversation: the pipeline's implementation of ``handlers.ChatLLM``.

The session owns the token-level trajectory. Model tokens are kept exactly as the backend
returned them (mask 1, with their logprobs); observation tokens are appended once, from the
chat template's suffix for the new message (mask 0). The backend always receives
``prompt_ids + response_ids``, so what it saw and what the trainer gets are the same ids.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from handlers.base import Generation
from prorl_celery.core.errors import BackendError, ContextExhausted
from prorl_celery.llm.backends import Completion, LLMBackend
from prorl_celery.llm.journal import TurnJournal
from prorl_celery.llm.sampling import for_protocol
from prorl_celery.llm.tokenizer import ChatTokenizer


async def _no_version() -> int | None:
    return None


class TokenSession:
    def __init__(self, *, tokenizer: ChatTokenizer, backend: LLMBackend, sampling_params: dict[str, Any],
                 max_model_len: int, default_max_tokens: int, max_output_tokens: int | None = None,
                 max_input_tokens: int | None = None,
                 policy_version: Callable[[], Awaitable[int | None]] | None = None,
                 journal: TurnJournal | None = None) -> None:
        """``sampling_params`` are sampler keys (``prorl_celery.llm.sampling.split``); those the
        backend's protocol does not take are dropped and listed in ``unsupported_params``.
        ``max_output_tokens`` caps every turn (with ``max_tokens``, the smaller wins);
        ``max_input_tokens`` caps the context a turn may start from. ``policy_version`` reads
        the version the backend serves now (a coroutine: the RUN loop must not block on Redis,
        ``BackendPool.current_version``); it is read as each turn's request is sent and once its
        reply is in, so a turn generated across a weight update says so. ``journal`` records
        every step (``prorl_celery.llm.journal``) and, when it replays, supplies the journaled
        model turns instead of the backend."""
        self.tokenizer = tokenizer
        self.backend = backend
        self.sampling, self.unsupported_params = for_protocol(sampling_params, getattr(backend, "protocol", "vllm"))
        caps = [c for c in (self.sampling.get("max_tokens"), max_output_tokens) if c is not None]
        self.sampling["max_tokens"] = min(caps) if caps else default_max_tokens
        self.max_model_len = max_model_len
        self.max_input_tokens = max_input_tokens
        self._policy_version = policy_version or _no_version
        self.tools: list[dict] | None = None
        self.prompt_ids: list[int] = []
        self.response_ids: list[int] = []
        self.response_mask: list[int] = []
        self.response_logprobs: list[float] = []
        self.turns: list[dict[str, Any]] = []  # what each backend call received and produced
        self._messages: list[dict[str, Any]] = []
        #: per message, its [start, end) in prompt_ids + response_ids: each token in exactly one
        self._spans: list[tuple[int, int]] = []
        self._open_turn = False  # the last model turn ended without the end-of-turn token
        #: earlier segments (``new_segment``), each a record of its own ids, mask and logprobs
        self.archived_segments: list[dict[str, Any]] = []
        #: why each segment after the first was started (which turn, why)
        self.drift_events: list[dict[str, Any]] = []
        self.journal = journal

    async def fit_backend_context(self) -> None:
        """Shrink the context length to the backend's own when it reports a smaller one, so a
        turn never asks for more than the server holds (PRORL_MAX_MODEL_LEN is an upper bound)."""
        length = await self.backend.context_length()
        if length is not None:
            self.max_model_len = min(self.max_model_len, length)

    # -- handlers.ChatLLM ---------------------------------------------------------------------

    def start(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> None:
        if self._messages:
            raise RuntimeError("the conversation has already started")
        self._messages = [dict(m) for m in messages]
        self.tools = tools
        self.prompt_ids = self.tokenizer.prompt_ids(self._messages, tools)
        start = 0
        for end in self.tokenizer.message_ends(self._messages, self.prompt_ids, tools):
            self._spans.append((start, end))
            start = end
        if self.journal is not None:
            self.journal.on_start(self.prompt_ids)

    async def generate(self, **sampling_overrides: Any) -> Generation:
        if not self._messages:
            raise RuntimeError("start() the conversation before generate()")
        params = {**self.sampling, **sampling_overrides}
        params["max_tokens"] = min(int(params["max_tokens"]), self.context_left)
        if params["max_tokens"] <= 0:
            raise ContextExhausted(self._exhausted())
        context = self.prompt_ids + self.response_ids
        replayed = None
        if self.journal is not None:
            await self.journal.flush()  # the last turn's actions and observations, before this one
            replayed = self.journal.next_generation()
        if replayed is not None:  # journaled: never generated twice
            completion = Completion(list(replayed["ids"]), list(replayed["lp"]), replayed["fin"])
            turn = dict(replayed["rec"])
        else:
            version_before = await self._policy_version()
            completion = await self.backend.complete(context, params)
            version_after = await self._policy_version()
            self._check_lengths(completion)
            turn = {"context_len": len(context), "output_start": len(self.response_ids),
                    "output_len": len(completion.token_ids), "finish_reason": completion.finish_reason,
                    "policy_version": version_after}
            if version_before != version_after:  # weights changed while this turn was generated
                turn.update(spans_update=True, policy_version_start=version_before)
            turn["segment"] = len(self.archived_segments)  # every turn says its segment, the first's 0
        start = self._total
        self.turns.append(turn)
        self._append(completion.token_ids, mask=1, logprobs=completion.logprobs)
        self._open_turn = not completion.token_ids or completion.token_ids[-1] != self.tokenizer.eot_id
        text = self.tokenizer.decode(completion.token_ids)
        self._messages.append({"role": "assistant", "content": text})
        self._spans.append((start, self._total))
        if self.journal is not None and replayed is None:
            # written before the handler acts on it: a crash during its tools costs no token again
            self.journal.on_generation(turn, list(completion.token_ids), list(completion.logprobs),
                                       completion.finish_reason)
            await self.journal.flush()
        return Generation(text, list(completion.token_ids), list(completion.logprobs), completion.finish_reason)

    def add_message(self, role: str, content: str, **fields: Any) -> None:
        if not self._messages:
            raise RuntimeError("start() the conversation before add_message()")
        message = {"role": role, "content": content, **fields}
        start = self._total  # template tokens closing a cut-off turn belong to what follows
        if self._open_turn:  # close the truncated model turn as the template would have
            self._append(self.tokenizer.encode(self.tokenizer.eot_token), mask=0)
            self._open_turn = False
        self._append(self.tokenizer.observation_ids(message, self.tools), mask=0)
        self._messages.append(message)
        self._spans.append((start, self._total))
        if self.journal is not None:
            self.journal.on_observation([message], self.response_ids[start - len(self.prompt_ids):])

    def note_action(self, name: str | None, arguments: Any) -> None:
        """A tool action the handler carries out after the last model turn, for the journal
        (a replay checks that it is the same)."""
        if self.journal is not None:
            self.journal.on_action(name, arguments)

    def _check_lengths(self, completion: Completion) -> None:
        """The trajectory invariant, for every protocol: one logprob per generated id."""
        if len(completion.logprobs) != len(completion.token_ids):
            raise BackendError(
                f"turn {self.num_turns + 1}: {getattr(self.backend, 'address', 'the backend')} returned "
                f"{len(completion.token_ids)} token ids but {len(completion.logprobs)} logprobs; a trajectory "
                f"needs exactly one logprob per id")

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self._messages)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def context_left(self) -> int:
        """Tokens the next turn may generate: 0 once the context is over ``max_input_tokens``."""
        used = len(self.prompt_ids) + len(self.response_ids)
        if self.max_input_tokens is not None and used > self.max_input_tokens:
            return 0
        return self.max_model_len - used

    def _exhausted(self) -> str:
        used = len(self.prompt_ids) + len(self.response_ids)
        if self.max_input_tokens is not None and used > self.max_input_tokens:
            return (f"the context ({used} tokens) is over max_input_tokens {self.max_input_tokens} "
                    f"after {self.num_turns} turns")
        return f"context length {self.max_model_len} reached after {self.num_turns} turns"

    # -- segments and raw-id conversations (the per-job OpenAI-compatible endpoint) ------------

    def add_messages(self, messages: list[dict[str, Any]]) -> None:
        """Append several observation messages at once, as the template's one suffix after the
        last model turn (templates that merge consecutive tool messages into one turn get the
        ids they would render). One message is exactly ``add_message``."""
        if not self._messages:
            raise RuntimeError("start() the conversation before add_messages()")
        from prorl_celery.llm.segments import suffix_ids
        messages = [dict(m) for m in messages]
        start = self._total
        if self._open_turn:
            self._append(self.tokenizer.encode(self.tokenizer.eot_token), mask=0)
            self._open_turn = False
        ids, ends = suffix_ids(self.tokenizer, messages, self.tools)
        base = self._total
        self._append(ids, mask=0)
        first = start
        for message, end in zip(messages, ends):
            self._messages.append(message)
            self._spans.append((start, base + end))
            start = base + end
        if self.journal is not None:
            self.journal.on_observation(messages, self.response_ids[first - len(self.prompt_ids):])

    def start_ids(self, prompt_ids: list[int], text: str) -> None:
        """Begin a conversation from raw prompt ids (``/v1/completions``): one ``prompt`` message."""
        if self._messages:
            raise RuntimeError("the conversation has already started")
        self.prompt_ids = list(prompt_ids)
        self._messages = [{"role": "prompt", "content": text}]
        self._spans.append((0, len(self.prompt_ids)))
        if self.journal is not None:
            self.journal.on_start(self.prompt_ids)

    def add_ids(self, ids: list[int], text: str) -> None:
        """Append raw observation ids (mask 0) after a model turn, as one ``prompt`` message."""
        if not self._messages:
            raise RuntimeError("start_ids() the conversation before add_ids()")
        start = self._total
        self._append(list(ids), mask=0)
        self._open_turn = False
        self._messages.append({"role": "prompt", "content": text})
        self._spans.append((start, self._total))
        if self.journal is not None:
            self.journal.on_observation([{"role": "prompt", "content": text}], list(ids))

    @property
    def started(self) -> bool:
        return bool(self._messages)

    @property
    def context_ids(self) -> list[int]:
        """What the backend receives for the next turn of this segment."""
        return self.prompt_ids + self.response_ids

    def segment_record(self) -> dict[str, Any]:
        """The current segment: its own ids, mask, logprobs, messages and turns."""
        index = len(self.archived_segments)
        return {"prompt_ids": list(self.prompt_ids), "response_ids": list(self.response_ids),
                "response_mask": list(self.response_mask), "response_logprobs": list(self.response_logprobs),
                "messages": self.messages, "message_spans": [list(span) for span in self._spans],
                "tools": self.tools,
                "turns": [t for t in self.turns if t.get("segment", 0) == index]}

    def new_segment(self, drift: dict[str, Any]) -> None:
        """Archive the current segment and start an empty one (``start``/``start_ids`` it next);
        ``drift`` says which turn and why, and is recorded as a drift event."""
        self.archived_segments.append(self.segment_record())
        self.drift_events.append({"segment": len(self.archived_segments), **drift})
        if self.journal is not None:
            self.journal.on_segment(drift)
        self.prompt_ids, self.response_ids, self.response_mask, self.response_logprobs = [], [], [], []
        self._messages, self._spans, self._open_turn, self.tools = [], [], False, None

    @property
    def segments(self) -> list[dict[str, Any]]:
        return [*self.archived_segments, self.segment_record()]

    def segmented_trajectory(self) -> dict[str, Any]:
        """``trajectory()`` (its top-level ids are the last segment's) with ``segments`` and
        ``drift_events``, for a conversation that may have been split."""
        record = self.trajectory()
        record["segments"] = self.segments
        record["drift_events"] = list(self.drift_events)
        record["drifted_tokens"] = sum(int(e.get("drifted_tokens", 0)) for e in self.drift_events)
        return record

    # -- trajectory ----------------------------------------------------------------------------

    @property
    def _total(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def _append(self, ids: list[int], *, mask: int, logprobs: list[float] | None = None) -> None:
        self.response_ids += ids
        self.response_mask += [mask] * len(ids)
        self.response_logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    @property
    def policy_versions(self) -> list[int]:
        """Every policy version that produced a token of this trajectory, oldest first."""
        seen = {t["policy_version"] for t in self.turns} | \
            {t["policy_version_start"] for t in self.turns if "policy_version_start" in t}
        return sorted(v for v in seen if v is not None)

    def trajectory(self) -> dict[str, Any]:
        """The token-level record returned to the trainer."""
        versions = self.policy_versions
        return {
            "policy_versions": versions,
            # one version produced every model token (None: the backend's version was never set)
            "on_policy": (len(versions) == 1 and not any(t.get("spans_update") for t in self.turns))
            if versions else None,
            "prompt_ids": self.prompt_ids,
            "response_ids": self.response_ids,
            "response_mask": self.response_mask,
            "response_logprobs": self.response_logprobs,
            "messages": self.messages,
            "message_spans": [list(span) for span in self._spans],
            "tools": self.tools,
            "num_turns": self.num_turns,
            "turns": self.turns,
            "backend": getattr(self.backend, "address", None),
            "tokenizer": self.tokenizer.name,
            "logprobs_mode": "raw",
            **({"segments": self.segments, "drift_events": list(self.drift_events),
                "drifted_tokens": sum(int(e.get("drifted_tokens", 0)) for e in self.drift_events)}
               if self.archived_segments else {}),
        }
