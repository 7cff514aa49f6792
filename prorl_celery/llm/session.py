"""Token-in/token-out conversation: the pipeline's implementation of ``handlers.ChatLLM``.

The session owns the token-level trajectory. Model tokens are kept exactly as the backend
returned them (mask 1, with their logprobs); observation tokens are appended once, from the
chat template's suffix for the new message (mask 0). The backend always receives
``prompt_ids + response_ids``, so what it saw and what the trainer gets are the same ids.

A rollout may give several training samples (DESIGN decision 19): the per-job endpoint serves
sub-agents, small-model calls and rewritten histories, each its own token sequence. The session
holds one :class:`SampleState` per sample, each with its own ids, mask, logprobs and messages,
and names where it came from (``origin``: ``main``, ``subagent``, ``auxiliary``, ``rewrite``).
One sample is active at a time; ``prompt_ids``, ``response_ids``... are the active one's. A
handler's own agent loop only ever has the one ``main`` sample.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from handlers.base import Generation
from prorl_celery.core.errors import BackendError, ContextExhausted
from prorl_celery.llm.backends import Completion, LLMBackend
from prorl_celery.llm.journal import TurnJournal
from prorl_celery.llm.sampling import for_protocol
from prorl_celery.llm.tokenizer import ChatTokenizer

#: where a sample came from: the agent's own conversation, a second conversation of the same model
#: (Claude Code's Task tool), a call under another model name (titles from a small model), or a
#: segment started when the agent rewrote its history
ORIGINS = ("main", "subagent", "auxiliary", "rewrite")


async def _no_version() -> int | None:
    return None


@dataclass
class SampleState:
    """One training sample: its token record, its messages, and where it came from."""

    model: str | None = None  # the model name the agent asked for (None: the handler's own loop)
    parent: int | None = None  # a rewrite: the sample it rewrote; None: a conversation of its own
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    #: per message, its [start, end) in prompt_ids + response_ids: each token in exactly one
    spans: list[tuple[int, int]] = field(default_factory=list)
    open_turn: bool = False  # the last model turn ended without the end-of-turn token
    tools: list[dict] | None = None

    @property
    def total(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


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
        self.turns: list[dict[str, Any]] = []  # what each backend call received and produced
        self.sample_states: list[SampleState] = [SampleState()]
        self.active = 0  # the sample the next call works on
        #: the model name the main agent is configured with (the per-job endpoint's), and those
        #: configured for a small model: they decide which conversations are ``auxiliary``
        self.main_model: str | None = None
        self.auxiliary_models: frozenset[str] = frozenset()
        #: why each sample that rewrote an earlier one was started (which turn, why)
        self.drift_events: list[dict[str, Any]] = []
        self.journal = journal

    # -- the active sample's record ----------------------------------------------------------

    @property
    def _sample(self) -> SampleState:
        return self.sample_states[self.active]

    @property
    def prompt_ids(self) -> list[int]:
        return self._sample.prompt_ids

    @prompt_ids.setter
    def prompt_ids(self, value: list[int]) -> None:
        self._sample.prompt_ids = value

    @property
    def response_ids(self) -> list[int]:
        return self._sample.response_ids

    @property
    def response_mask(self) -> list[int]:
        return self._sample.response_mask

    @property
    def response_logprobs(self) -> list[float]:
        return self._sample.response_logprobs

    @property
    def tools(self) -> list[dict] | None:
        return self._sample.tools

    @property
    def message_spans(self) -> list[tuple[int, int]]:
        return self._sample.spans

    async def fit_backend_context(self) -> None:
        """Shrink the context length to the backend's own when it reports a smaller one, so a
        turn never asks for more than the server holds (PRORL_MAX_MODEL_LEN is an upper bound)."""
        length = await self.backend.context_length()
        if length is not None:
            self.max_model_len = min(self.max_model_len, length)

    # -- handlers.ChatLLM ---------------------------------------------------------------------

    def start(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> None:
        sample = self._sample
        if sample.messages:
            raise RuntimeError("the conversation has already started")
        sample.messages = [dict(m) for m in messages]
        sample.tools = tools
        sample.prompt_ids = self.tokenizer.prompt_ids(sample.messages, tools)
        start = 0
        for end in self.tokenizer.message_ends(sample.messages, sample.prompt_ids, tools):
            sample.spans.append((start, end))
            start = end
        if self.journal is not None:
            self.journal.on_start(sample.prompt_ids)

    async def generate(self, **sampling_overrides: Any) -> Generation:
        sample = self._sample
        if not sample.messages:
            raise RuntimeError("start() the conversation before generate()")
        params = {**self.sampling, **sampling_overrides}
        params["max_tokens"] = min(int(params["max_tokens"]), self.context_left)
        if params["max_tokens"] <= 0:
            raise ContextExhausted(self._exhausted())
        context = sample.prompt_ids + sample.response_ids
        replayed = None
        if self.journal is not None:
            await self.journal.flush_before_turn()  # the last turn's actions and observations, first
            replayed = self.journal.next_generation()
        if replayed is not None:  # journaled: never generated twice
            completion = Completion(list(replayed["ids"]), list(replayed["lp"]), replayed["fin"])
            # where the turn sits is this run's: an observation equal to the journal's only past
            # its volatile fields may have another token count (with none, these are the same)
            turn = {**replayed["rec"], "context_len": len(context), "output_start": len(sample.response_ids)}
        else:
            version_before = await self._policy_version()
            completion = await self.backend.complete(context, params)
            version_after = await self._policy_version()
            self._check_lengths(completion)
            # every turn says its sample (and segment, the same index; the first's 0)
            turn = {"context_len": len(context), "output_start": len(sample.response_ids),
                    "output_len": len(completion.token_ids), "finish_reason": completion.finish_reason,
                    "policy_version": version_after, "segment": self.active, "sample": self.active}
            if version_before != version_after:  # weights changed while this turn was generated
                turn.update(spans_update=True, policy_version_start=version_before)
        start = sample.total
        self.turns.append(turn)
        self._append(sample, completion.token_ids, mask=1, logprobs=completion.logprobs)
        sample.open_turn = not completion.token_ids or completion.token_ids[-1] != self.tokenizer.eot_id
        text = self.tokenizer.decode(completion.token_ids)
        sample.messages.append({"role": "assistant", "content": text})
        sample.spans.append((start, sample.total))
        if self.journal is not None and replayed is None:
            # written before the handler acts on it: a crash during its tools costs no token again
            self.journal.on_generation(turn, list(completion.token_ids), list(completion.logprobs),
                                       completion.finish_reason)
            await self.journal.flush()
        return Generation(text, list(completion.token_ids), list(completion.logprobs), completion.finish_reason)

    def add_message(self, role: str, content: str, **fields: Any) -> None:
        sample = self._sample
        if not sample.messages:
            raise RuntimeError("start() the conversation before add_message()")
        message = {"role": role, "content": content, **fields}
        start = sample.total  # template tokens closing a cut-off turn belong to what follows
        self._close_open_turn(sample)
        self._append(sample, self.tokenizer.observation_ids(message, sample.tools), mask=0)
        sample.messages.append(message)
        sample.spans.append((start, sample.total))
        if self.journal is not None:
            self.journal.on_observation([message], sample.response_ids[start - len(sample.prompt_ids):])

    def note_action(self, name: str | None, arguments: Any) -> None:
        """A tool action the handler carries out after the last model turn, for the journal
        (a replay checks that it is the same)."""
        if self.journal is not None:
            self.journal.on_action(name, arguments)

    def _close_open_turn(self, sample: SampleState) -> None:
        if sample.open_turn:  # close the truncated model turn as the template would have
            self._append(sample, self.tokenizer.encode(self.tokenizer.eot_token), mask=0)
            sample.open_turn = False

    def _check_lengths(self, completion: Completion) -> None:
        """The trajectory invariant, for every protocol: one logprob per generated id."""
        if len(completion.logprobs) != len(completion.token_ids):
            raise BackendError(
                f"turn {self.num_turns + 1}: {getattr(self.backend, 'address', 'the backend')} returned "
                f"{len(completion.token_ids)} token ids but {len(completion.logprobs)} logprobs; a trajectory "
                f"needs exactly one logprob per id")

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self._sample.messages)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def context_left(self) -> int:
        """Tokens the next turn may generate: 0 once the context is over ``max_input_tokens``."""
        used = self._sample.total
        if self.max_input_tokens is not None and used > self.max_input_tokens:
            return 0
        return self.max_model_len - used

    def _exhausted(self) -> str:
        used = self._sample.total
        if self.max_input_tokens is not None and used > self.max_input_tokens:
            return (f"the context ({used} tokens) is over max_input_tokens {self.max_input_tokens} "
                    f"after {self.num_turns} turns")
        return f"context length {self.max_model_len} reached after {self.num_turns} turns"

    # -- samples and raw-id conversations (the per-job endpoint) --------------------------------

    def add_messages(self, messages: list[dict[str, Any]]) -> None:
        """Append several observation messages at once, as the template's one suffix after the
        last model turn (templates that merge consecutive tool messages into one turn get the
        ids they would render). One message is exactly ``add_message``."""
        sample = self._sample
        if not sample.messages:
            raise RuntimeError("start() the conversation before add_messages()")
        from prorl_celery.endpoint.history import suffix_ids
        messages = [dict(m) for m in messages]
        start = sample.total
        self._close_open_turn(sample)
        ids, ends = suffix_ids(self.tokenizer, messages, sample.tools)
        base = sample.total
        self._append(sample, ids, mask=0)
        first = start
        for message, end in zip(messages, ends):
            sample.messages.append(message)
            sample.spans.append((start, base + end))
            start = base + end
        if self.journal is not None:
            self.journal.on_observation(messages, sample.response_ids[first - len(sample.prompt_ids):])

    def start_ids(self, prompt_ids: list[int], text: str) -> None:
        """Begin a conversation from raw prompt ids (``/v1/completions``): one ``prompt`` message."""
        sample = self._sample
        if sample.messages:
            raise RuntimeError("the conversation has already started")
        sample.prompt_ids = list(prompt_ids)
        sample.messages = [{"role": "prompt", "content": text}]
        sample.spans.append((0, len(sample.prompt_ids)))
        if self.journal is not None:
            self.journal.on_start(sample.prompt_ids)

    def add_ids(self, ids: list[int], text: str) -> None:
        """Append raw observation ids (mask 0) after a model turn, as one ``prompt`` message."""
        sample = self._sample
        if not sample.messages:
            raise RuntimeError("start_ids() the conversation before add_ids()")
        start = sample.total
        self._append(sample, list(ids), mask=0)
        sample.open_turn = False
        sample.messages.append({"role": "prompt", "content": text})
        sample.spans.append((start, sample.total))
        if self.journal is not None:
            self.journal.on_observation([{"role": "prompt", "content": text}], list(ids))

    @property
    def started(self) -> bool:
        return bool(self._sample.messages)

    @property
    def context_ids(self) -> list[int]:
        """What the backend receives for the next turn of the active sample."""
        return self.prompt_ids + self.response_ids

    @property
    def num_samples(self) -> int:
        return len(self.sample_states)

    def activate(self, index: int) -> None:
        """Make sample ``index`` the one the next call extends."""
        if not 0 <= index < len(self.sample_states):
            raise IndexError(f"no sample {index}")
        self.active = index

    def new_sample(self, *, model: str | None = None, parent: int | None = None,
                   drift: dict[str, Any] | None = None) -> int:
        """Start an empty sample (``start``/``start_ids`` it next) and make it the active one: a
        conversation of its own, or a rewrite of ``parent`` whose ``drift`` (which call and
        message, why) is recorded as a drift event. The session's first sample, before anything
        was served, is taken as it is."""
        fresh = SampleState(model=model, parent=parent)
        if len(self.sample_states) == 1 and not self.sample_states[0].messages and not self.turns:
            self.sample_states[0] = fresh
            self.active = 0
            return 0
        self.sample_states.append(fresh)
        self.active = len(self.sample_states) - 1
        if drift is not None:
            self.drift_events.append({"segment": self.active, "sample": self.active, **drift})
        if self.journal is not None:  # a replay checks that the same calls start the same samples
            self.journal.on_segment(drift if drift is not None else
                                    {"sample": self.active, "reason": "a new conversation"})
        return self.active

    def new_segment(self, drift: dict[str, Any]) -> None:
        """The agent rewrote the active sample's history: a new sample (origin ``rewrite``)."""
        self.new_sample(model=self._sample.model, parent=self.active, drift=drift)

    def _main_agent_model(self) -> str | None:
        """The main agent's model name: the configured one when a conversation used it, else
        the first conversation's that is not a small model's (a program that names its model
        itself), else the first conversation's."""
        models = [s.model for s in self.sample_states if s.parent is None and s.messages]
        if not models or self.main_model in models:
            return self.main_model
        return next((m for m in models if m not in self.auxiliary_models), models[0])

    def origins(self) -> list[str]:
        """Each sample's origin (``ORIGINS``): a rewrite; a conversation under another model
        name than the main agent's (auxiliary); the first conversation under it (main); a later
        one (subagent). Decided on the whole session, so a small model's call before the main
        agent's first one is still auxiliary."""
        main = self._main_agent_model()
        out: list[str] = []
        for sample in self.sample_states:
            if sample.parent is not None:
                out.append("rewrite")
            elif sample.model is not None and main is not None and sample.model != main:
                out.append("auxiliary")
            else:
                out.append("subagent" if "main" in out else "main")
        return out

    @property
    def main_line(self) -> list[int]:
        """The main agent's samples: its conversation and the rewrites of it, in order."""
        line: list[int] = []
        for index, (sample, origin) in enumerate(zip(self.sample_states, self.origins())):
            if origin == "main" or (origin == "rewrite" and sample.parent in line):
                line.append(index)
        return line

    @property
    def primary(self) -> int:
        """The sample a trajectory's top-level ids are: the main agent's last served one."""
        line = self.main_line
        if not line:
            return len(self.sample_states) - 1
        served = [t["sample"] for t in self.turns if t.get("sample") in line]
        return served[-1] if served else line[-1]

    def sample_record(self, index: int | None = None) -> dict[str, Any]:
        """One sample: its own ids, mask, logprobs, messages and turns, and its origin."""
        index = self.active if index is None else index
        sample = self.sample_states[index]
        turns = [t for t in self.turns if t.get("sample", 0) == index]
        versions = _versions(turns)
        return {"sample": index, "origin": self.origins()[index], "model": sample.model, "parent": sample.parent,
                "prompt_ids": list(sample.prompt_ids), "response_ids": list(sample.response_ids),
                "response_mask": list(sample.response_mask), "response_logprobs": list(sample.response_logprobs),
                "policy_versions": versions, "on_policy": _on_policy(versions, turns),
                "messages": list(sample.messages), "message_spans": [list(span) for span in sample.spans],
                "tools": sample.tools, "num_turns": len(turns), "turns": turns}

    def segment_record(self) -> dict[str, Any]:
        """The active sample's record (``sample_record``)."""
        return self.sample_record()

    @property
    def archived_segments(self) -> list[dict[str, Any]]:
        """Every sample but the active one (from when a rewrite archived the segment before)."""
        return [self.sample_record(i) for i in range(len(self.sample_states)) if i != self.active]

    @property
    def segments(self) -> list[dict[str, Any]]:
        """Every sample's record, in the order they were started."""
        return [self.sample_record(i) for i in range(len(self.sample_states))]

    def segmented_trajectory(self) -> dict[str, Any]:
        """``trajectory()`` with ``segments`` and ``drift_events`` even for one sample."""
        record = self.trajectory()
        if "segments" not in record:
            record["segments"] = self.segments
            record["drift_events"] = list(self.drift_events)
            record["drifted_tokens"] = sum(int(e.get("drifted_tokens", 0)) for e in self.drift_events)
        return record

    # -- trajectory ----------------------------------------------------------------------------

    @staticmethod
    def _append(sample: SampleState, ids: list[int], *, mask: int, logprobs: list[float] | None = None) -> None:
        sample.response_ids += ids
        sample.response_mask += [mask] * len(ids)
        sample.response_logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    @property
    def generated_tokens(self) -> int:
        """Model tokens of every sample."""
        return sum(sum(s.response_mask) for s in self.sample_states)

    @property
    def observed_tokens(self) -> int:
        """Observation tokens after the prompt, of every sample."""
        return sum(len(s.response_mask) for s in self.sample_states) - self.generated_tokens

    @property
    def policy_versions(self) -> list[int]:
        """Every policy version that produced a token of this trajectory, oldest first."""
        return _versions(self.turns)

    def trajectory(self) -> dict[str, Any]:
        """The token-level record returned to the trainer.

        Its top-level ids, messages and tools are the primary sample's (the main agent's last
        one); ``turns`` and ``policy_versions`` are every sample's. With more than one sample it
        also has ``samples`` (each sample's record, ``sample_record``), ``segments`` (the same
        records, under the name readers before samples know) and the drift events."""
        versions = self.policy_versions
        primary = self.sample_states[self.primary]
        record = {
            "policy_versions": versions,
            # one version produced every model token (None: the backend's version was never set)
            "on_policy": _on_policy(versions, self.turns),
            "prompt_ids": primary.prompt_ids,
            "response_ids": primary.response_ids,
            "response_mask": primary.response_mask,
            "response_logprobs": primary.response_logprobs,
            "messages": list(primary.messages),
            "message_spans": [list(span) for span in primary.spans],
            "tools": primary.tools,
            "num_turns": self.num_turns,
            "turns": self.turns,
            "backend": getattr(self.backend, "address", None),
            "tokenizer": self.tokenizer.name,
            "logprobs_mode": "raw",
        }
        if len(self.sample_states) > 1:
            samples = self.segments
            record.update(primary_sample=self.primary, samples=samples, segments=samples,
                          drift_events=list(self.drift_events),
                          drifted_tokens=sum(int(e.get("drifted_tokens", 0)) for e in self.drift_events))
        return record


def _versions(turns: list[dict[str, Any]]) -> list[int]:
    seen = {t["policy_version"] for t in turns} | \
        {t["policy_version_start"] for t in turns if "policy_version_start" in t}
    return sorted(v for v in seen if v is not None)


def _on_policy(versions: list[int], turns: list[dict[str, Any]]) -> bool | None:
    if not versions:
        return None  # the backend's version was never set
    return len(versions) == 1 and not any(t.get("spans_update") for t in turns)
