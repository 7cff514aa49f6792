"""Which training sample a call of the per-job endpoint belongs to (DESIGN decision 19).

A harness's calls are not one conversation: Claude Code's Task tool runs sub-agents, each with
its own system prompt and history, interleaved with the main agent's calls; a small fast model
writes titles under another model name; compaction rewrites the history. Each call is routed to
one sample of the job's :class:`~prorl_celery.llm.session.TokenSession`:

1. a sample whose served history the request repeats, with the same model name, is extended
   (:class:`~prorl_celery.endpoint.history.ChatMatcher` checks it token-exactly, as for one
   conversation): calls whose prompt extends an earlier call's prompt and response merge into
   one sample. When the matcher finds that the ids would not be what a text-rendering server
   sends (a retry, changed tools, a template that drops ``<think>``), the call starts a
   ``rewrite`` of that sample with a drift event;
2. a request that carries a model turn served in a sample of the same model name, or that
   shares more than its system prompt with one, or the main agent's system prompt, but does not
   extend it, rewrote that sample's history: a new sample of origin ``rewrite`` (``parent``:
   the sample it rewrote) with a drift event saying which message differs and why;
3. anything else is a new conversation (no drift: nothing served was rewritten). Its origin
   is decided on the whole session (``TokenSession.origins``): ``auxiliary`` under a model name
   other than the main agent's, else ``main`` for the first one and ``subagent`` after it. The
   main agent's model name is the endpoint's (the instance's ``model``) when a conversation used
   it, else the first conversation's that is not configured as a small model's
   (``auxiliary_models``): a program that names its model itself is still trained as the main one.

``/v1/completions`` calls follow the same rules on ids: a prompt that extends a completions
sample's ids (or decoded text) extends it; any other rewrites the model's latest sample (a
drift event), or starts a new conversation when the model has none.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prorl_celery.endpoint.history import ChatMatcher, Message, Plan, Reply
from prorl_celery.llm.session import TokenSession


@dataclass
class Route:
    """Where a call goes: the sample it extends (``index``), or a new sample: a rewrite of
    ``parent``, or (neither) a conversation of its own."""

    plan: Plan
    index: int | None = None
    parent: int | None = None

    @property
    def new(self) -> bool:
        return self.index is None


@dataclass(frozen=True)
class IdsRoute:
    """A completions call: extend ``index`` with ``suffix``, or start a new sample."""

    index: int | None
    suffix: list[int] | None = None
    parent: int | None = None
    drift: dict[str, Any] | None = None


class SampleRouter:
    """One :class:`ChatMatcher` per sample of ``session``, and the routing rules above."""

    def __init__(self, session: TokenSession, main_model: str, auxiliary_models: Sequence[str] = ()) -> None:
        self.session, self.main_model = session, main_model
        session.main_model, session.auxiliary_models = main_model, frozenset(auxiliary_models)
        self.matchers: list[ChatMatcher] = [ChatMatcher(session.tokenizer)]

    def matcher(self, index: int) -> ChatMatcher:
        while len(self.matchers) <= index:
            self.matchers.append(ChatMatcher(self.session.tokenizer))
        return self.matchers[index]

    def _model(self, index: int) -> str:
        return self.session.sample_states[index].model or self.main_model

    def _same_model(self, model: str, kind: str) -> list[int]:
        """Started samples of ``kind`` under ``model``, newest first."""
        return [i for i in reversed(range(self.session.num_samples))
                if self.matcher(i).kind == kind and self._model(i) == model]

    # -- chat ----------------------------------------------------------------------------------

    def route_chat(self, messages: list[Message], tools: list[dict] | None, model: str) -> Route:
        session = self.session
        candidates = self._same_model(model, "chat")
        # 1. a sample whose held messages the request repeats (the longest such), checked exactly
        extending = [i for i in candidates if self.matcher(i).held_prefix(messages) == len(self.matcher(i).held)]
        if extending:
            index = max(extending, key=lambda i: (len(self.matcher(i).held), i))
            state = session.sample_states[index]
            plan = self.matcher(index).plan(messages, tools, state.prompt_ids + state.response_ids, state.spans)
            if plan.action == "extend":
                return Route(plan, index=index)
            return Route(plan, parent=index)
        # 2. a rewrite of a sample this request descends from
        parent = self._rewritten(messages, candidates)
        if parent is None and not candidates:  # the model's calls were /v1/completions so far
            parent = next(iter(self._same_model(model, "completion")), None)
        if parent is not None:
            plan = self.matcher(parent).plan(messages, tools)
            return Route(plan, parent=parent)
        # 3. a new conversation
        return Route(ChatMatcher(session.tokenizer).plan(messages, tools))

    def _started(self, indexes: Sequence[int]) -> bool:
        return any(self.matcher(i).kind is not None for i in indexes)

    def _rewritten(self, messages: list[Message], candidates: list[int]) -> int | None:
        """The sample ``messages`` rewrote: the one most of whose served turns it carries, else
        the one it shares the longest prefix with (more than a system prompt, or the main
        agent's system prompt); None for a new conversation."""
        best: tuple[int, int, int] | None = None
        main_line = set(self.session.main_line)
        for index in candidates:
            matcher = self.matcher(index)
            carried = matcher.replies_carried(messages)
            prefix = matcher.held_prefix(messages)
            system = bool(messages) and messages[0].role == "system"
            if carried == 0 and not (prefix >= 2 or (prefix >= 1 and (index in main_line or not system))):
                continue
            key = (carried, prefix, index)
            if best is None or key > best:
                best = key
        return None if best is None else best[2]

    def observed(self, index: int, plan: Plan, messages: list[Message], tools: list[dict] | None) -> None:
        self.matcher(index).observed(plan, messages, tools)

    def replied(self, index: int, reply: Reply) -> None:
        self.matcher(index).replied(reply)

    # -- completions ---------------------------------------------------------------------------

    def route_ids(self, ids: list[int] | None, text: str | None, model: str) -> IdsRoute:
        session, tok = self.session, self.session.tokenizer
        completions = self._same_model(model, "completion")
        for index in completions:
            state = session.sample_states[index]
            suffix = continuation(tok, state.prompt_ids + state.response_ids, ids, text)
            if suffix is not None:
                return IdsRoute(index, suffix=suffix)
        latest = [int(t["sample"]) for t in session.turns if self._model(t["sample"]) == model]
        if latest:  # the model's latest sample, rewritten
            parent = latest[-1]
            why = ("the prompt does not extend the text already served (history rewritten)"
                   if self.matcher(parent).kind == "completion"
                   else "the agent switched from /v1/chat/completions to /v1/completions")
            return IdsRoute(None, parent=parent, drift={"message": None, "reason": why})
        return IdsRoute(None)


def continuation(tok: Any, held: list[int], ids: list[int] | None, text: str | None) -> list[int] | None:
    """The new ids of a completions prompt that extends the ids already served, else None.

    A text agent appends the completion's ``text``, which leaves out the end-of-turn token the
    model ended on (special tokens are not in ``text``): a prompt that extends the served text
    without that last special token is a continuation too, and the token stays in the ids, as
    the model generated it and the backend saw it."""
    bare = held[:-1] if held and tok.decode(held[-1:], True) == "" else None  # ends on a hidden token
    if ids is not None:
        for kept in (held, bare):
            if kept is not None and len(ids) > len(kept) and ids[:len(kept)] == kept:
                return ids[len(kept):]
        return None
    if text is None:
        return None
    for kept in (held, bare):
        if kept is None:
            continue
        served = tok.decode(kept, False)
        if len(text) > len(served) and text.startswith(served):
            return tok.encode(text[len(served):])
    return None
