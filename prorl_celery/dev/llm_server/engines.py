"""Generation engines behind the HTTP LLM server.

An engine holds a tokenizer and turns prompt ids into a stream of :class:`Step` (token id,
raw logprob, optional top alternatives). Stopping (eos, stop ids, max tokens) is decided by
the server's driver, not here, so both engines stop the same way:

* :class:`ScriptedEngine` replays replies chosen by regex rules, or emits seeded random ids
  from the whole vocabulary when no rule matches (tests, benches).
* :class:`TorchEngine` runs a Hugging Face causal LM on CPU with a KV cache (needs torch).
"""
from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import random
import re
import weakref
from collections.abc import AsyncGenerator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

#: temperatures below this sample greedily (as vLLM does)
GREEDY_EPS = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """What every protocol's request boils down to."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    #: how many alternatives to report beside each sampled token
    top_logprobs: int = 0


@dataclass(frozen=True)
class Step:
    token_id: int
    #: log-probability of ``token_id`` under the raw next-token distribution
    logprob: float
    #: the ``top_logprobs`` most likely (token id, logprob), best first
    top: tuple[tuple[int, float], ...] = ()


class Engine(Protocol):
    tokenizer: Any
    model_name: str
    #: prompt ids must lie in ``range(vocab_size)``
    vocab_size: int
    max_model_len: int
    eos_token_id: int
    #: further end-of-sequence ids (generation_config); vLLM treats them as stop ids
    extra_eos_ids: frozenset[int]

    def generate(self, prompt_ids: list[int],
                 params: SamplingParams) -> AsyncGenerator[Step, None]:
        """Yield tokens until the caller stops iterating (or the engine has nothing more)."""
        ...


def load_tokenizer(tokenizer: Any) -> Any:
    """A tokenizer object as is; a path (or "qwen3"/"llama3") through ``AutoTokenizer``."""
    if not isinstance(tokenizer, (str, Path)):
        return tokenizer
    from transformers import AutoTokenizer

    from prorl_celery.dev.devmodels import TOKENIZER_NAMES, ensure_tokenizer

    path = ensure_tokenizer(str(tokenizer)) if str(tokenizer) in TOKENIZER_NAMES else tokenizer
    return AutoTokenizer.from_pretrained(path)


def _stable_int(*parts: object) -> int:
    """A hash that, unlike ``hash()``, is the same in every process."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def fake_logprob(position: int, token_id: int) -> float:
    """Deterministic logprob in [-8, -0.001] for scripted output."""
    return -((_stable_int(position, token_id) % 8000) + 1) / 1000.0


# ----------------------------------------------------------------------------- scripted


class Rule(BaseModel):
    """``match`` is a regex searched in the last user/tool message (or the whole prompt)."""

    model_config = ConfigDict(extra="forbid")
    match: str
    replies: list[str] = Field(min_length=1)
    delay_s: float = Field(default=0.0, ge=0)
    #: "last_user" (the brief's default) or "prompt": search the whole decoded prompt, so
    #: one rule can script several turns whose observations vary
    scope: str = Field(default="last_user", pattern="^(last_user|prompt)$")
    #: ``[m, r]``: the rule applies only to a request whose ``seed`` s has ``s % m == r`` (none
    #: without a seed). Forks of one job share their prompt and differ in their seeds (``seed + 1
    #: + i``): this is how a script makes their answers differ
    seed_mod: tuple[int, int] | None = None

    @field_validator("seed_mod")
    @classmethod
    def _modulus(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and not 0 <= value[1] < value[0]:
            raise ValueError(f"seed_mod [m, r] needs 0 <= r < m, got {list(value)}")
        return value

    def takes_seed(self, seed: int | None) -> bool:
        if self.seed_mod is None:
            return True
        return seed is not None and seed % self.seed_mod[0] == self.seed_mod[1]


_RULES = TypeAdapter(list[Rule])


def load_rules(source: str | Path | Sequence[dict | Rule]) -> list[Rule]:
    """Rules from a list, or from a JSON file holding a list or ``{"rules": [...]}``."""
    rules: Sequence[dict | Rule]
    if isinstance(source, (str, Path)):
        data = json.loads(Path(source).read_text())
        rules = data["rules"] if isinstance(data, dict) else data
    else:
        rules = source
    return _RULES.validate_python([r.model_dump() if isinstance(r, Rule) else r for r in rules])


class _ChatMarkers:
    """Strings found by rendering probe conversations with the tokenizer's chat template."""

    def __init__(self, tokenizer: Any) -> None:
        self.end_of_turn: str = tokenizer.eos_token or ""
        #: what opens every assistant turn, e.g. "<|im_start|>assistant\n"
        self.generation_prompt = ""
        #: (header, footer) around a turn the model reacts to: user, and tool if rendered
        self.observation_frames: list[tuple[str, str]] = []
        if not getattr(tokenizer, "chat_template", None):
            return  # no template: rules see the whole prompt, every prompt is turn 0
        render = tokenizer.apply_chat_template
        probe = [{"role": "user", "content": "zqxPROBE"}]
        bare = render(probe, tokenize=False)
        with_prompt = render(probe, tokenize=False, add_generation_prompt=True)
        if with_prompt.startswith(bare):
            self.generation_prompt = with_prompt[len(bare):]
        frames = {self._frame(render, role) for role in ("user", "tool")}
        self.observation_frames = [frame for frame in frames if frame[0]]

    def _frame(self, render: Any, role: str) -> tuple[str, str]:
        messages = [{"role": "user", "content": "zqxA"}, {"role": "assistant", "content": "zqxB"},
                    {"role": role, "content": "zqxC"}]
        try:
            text = render(messages, tokenize=False)
        except Exception:  # a template may reject a role
            return "", ""
        at = text.find("zqxC")
        if at < 0:
            return "", ""
        header = text[:at].rsplit("zqxB", 1)[-1]
        if self.end_of_turn and self.end_of_turn in header:
            header = header.split(self.end_of_turn, 1)[1]
        footer = text[at + 4:]
        if self.end_of_turn:
            footer = footer.split(self.end_of_turn, 1)[0]
        # a template may JSON-quote tool content (Llama 3.1): the quotes belong to the frame
        return header.lstrip(), footer

    def last_observation(self, prompt: str) -> str:
        """Text of the last user/tool turn, without its template framing."""
        best_end, footer = -1, ""
        for header, frame_footer in self.observation_frames:
            at = prompt.rfind(header)
            if at >= 0 and at + len(header) > best_end:
                best_end, footer = at + len(header), frame_footer
        text = prompt[best_end:] if best_end >= 0 else prompt
        if self.end_of_turn:
            text = text.split(self.end_of_turn, 1)[0]
        return text[:-len(footer)] if footer and text.endswith(footer) else text

    def assistant_turns(self, prompt: str) -> int:
        if not self.generation_prompt:
            return 0
        return max(0, prompt.count(self.generation_prompt) - 1)


class ScriptedEngine:
    """Replies chosen by rules; seeded random ids from the whole vocabulary otherwise.

    The reply for the first matching rule is ``replies[min(turn, len - 1)]`` where ``turn`` is
    the number of assistant turns already in the prompt; it is tokenized and followed by the
    eos id. With no match, the output is pseudo-random ids (seeded by prompt, engine seed and
    request seed; one draw in five from the special/added tokens) ending in eos at a random
    length <= max_tokens, which stresses re-tokenization drift in clients.
    """

    def __init__(self, tokenizer: Any, rules: str | Path | Sequence[dict | Rule] = (), *,
                 token_delay_s: float = 0.0, seed: int = 0, model_name: str | None = None,
                 max_model_len: int = 32768) -> None:
        self.tokenizer = load_tokenizer(tokenizer)
        self.rules = load_rules(rules)
        self._patterns = [re.compile(rule.match) for rule in self.rules]
        self.token_delay_s = token_delay_s
        self.seed = seed
        self.vocab_size = len(self.tokenizer)
        self.max_model_len = max_model_len
        self.eos_token_id = int(self.tokenizer.eos_token_id)
        self.extra_eos_ids: frozenset[int] = frozenset()
        base = Path(getattr(self.tokenizer, "name_or_path", "") or "tokenizer").name
        self.model_name = model_name or f"scripted-{base}"
        self.markers = _ChatMarkers(self.tokenizer)
        added = set(getattr(self.tokenizer, "added_tokens_decoder", {}) or {})
        special = added | set(self.tokenizer.all_special_ids)
        self._special_pool = sorted(special - {self.eos_token_id})

    def pick(self, prompt_ids: list[int], seed: int | None = None) -> tuple[Rule | None, int]:
        """The matching rule (or None) and the assistant-turn index for this prompt (and the
        request's ``seed``, for rules with ``seed_mod``)."""
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        last = self.markers.last_observation(prompt)
        turn = self.markers.assistant_turns(prompt)
        for rule, pattern in zip(self.rules, self._patterns):
            if rule.takes_seed(seed) and pattern.search(prompt if rule.scope == "prompt" else last):
                return rule, turn
        return None, turn

    async def generate(self, prompt_ids: list[int],
                       params: SamplingParams) -> AsyncGenerator[Step, None]:
        rule, turn = self.pick(prompt_ids, params.seed)
        if rule is not None:
            reply = rule.replies[min(turn, len(rule.replies) - 1)]
            ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.eos_token_id]
            if rule.delay_s:
                await asyncio.sleep(rule.delay_s)
        else:
            ids = self._random_ids(prompt_ids, params)
        for position, token_id in enumerate(ids):
            if position and self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            yield self._step(position, token_id, params.top_logprobs)

    def _random_ids(self, prompt_ids: list[int], params: SamplingParams) -> list[int]:
        rng = random.Random(_stable_int(tuple(prompt_ids), self.seed, params.seed))
        avoid = {self.eos_token_id} | set(params.stop_token_ids)
        length = rng.randint(1, max(1, params.max_tokens))
        ids: list[int] = []
        while len(ids) < length - 1:
            if self._special_pool and rng.random() < 0.2:
                token_id = rng.choice(self._special_pool)
            else:
                token_id = rng.randrange(self.vocab_size)
            if token_id not in avoid:
                ids.append(token_id)
        return ids + [self.eos_token_id]

    def _step(self, position: int, token_id: int, top_n: int) -> Step:
        logprob = fake_logprob(position, token_id)
        top = [(token_id, logprob)]
        for j in range(1, top_n):
            top.append(((token_id + 7919 * j) % self.vocab_size, logprob - 0.5 * j))
        return Step(token_id, logprob, tuple(top[:top_n]))


# ----------------------------------------------------------------------------- torch


class TorchEngine:
    """A Hugging Face causal LM on CPU: KV-cached forward passes, seeded sampling.

    Logprobs are the raw ``log_softmax`` of the logits, before temperature/top-k/top-p (vLLM's
    default ``raw_logprobs``). Requests are served one at a time; forward passes run on one
    worker thread so the event loop stays responsive and an aborted request never overlaps
    the next one's forward pass.
    """

    def __init__(self, model_dir: str | Path, *, tokenizer: Any = None,
                 model_name: str | None = None, threads: int = 1) -> None:
        try:
            import torch
        except ImportError as error:
            raise RuntimeError("TorchEngine needs torch: pip install 'prorl-celery[model]'") \
                from error
        from transformers import AutoModelForCausalLM, GenerationConfig

        torch.set_num_threads(threads)
        self._torch = torch
        # transformers' stubs type .to() by its model argument only; a dtype is what it is given here
        self.model = AutoModelForCausalLM.from_pretrained(model_dir).to(torch.float32).eval()  # type: ignore[arg-type]
        self.tokenizer = load_tokenizer(tokenizer if tokenizer is not None else model_dir)
        config = self.model.config
        self.model_name = model_name or Path(model_dir).name
        self.vocab_size = int(self.model.get_input_embeddings().weight.shape[0])
        self.max_model_len = int(getattr(config, "max_position_embeddings", 4096))
        self.eos_token_id = int(self.tokenizer.eos_token_id)
        try:
            generation_eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
        except OSError:
            generation_eos = config.eos_token_id
        if isinstance(generation_eos, int):
            generation_eos = [generation_eos]
        self.extra_eos_ids = frozenset(generation_eos or ()) - {self.eos_token_id}
        # transformers 5 renamed ``past_key_values`` to ``cache``
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch-engine")
        # one lock per event loop: an engine may back servers on several loops (tests)
        self._locks: weakref.WeakKeyDictionary[Any, asyncio.Lock] = weakref.WeakKeyDictionary()

    async def generate(self, prompt_ids: list[int],
                       params: SamplingParams) -> AsyncGenerator[Step, None]:
        loop = asyncio.get_running_loop()
        async with self._locks.setdefault(loop, asyncio.Lock()):
            state = _TorchState(prompt_ids, self._make_generator(params.seed))
            for _ in range(params.max_tokens):
                yield await loop.run_in_executor(self._executor, self._next, state, params)

    def _make_generator(self, seed: int | None) -> Any:
        generator = self._torch.Generator()
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        return generator

    def _next(self, state: _TorchState, params: SamplingParams) -> Step:
        torch = self._torch
        with torch.no_grad():
            fed = state.pending
            outputs = self.model(input_ids=torch.tensor([fed]), use_cache=True,
                                 **{self._cache_arg: state.cache})
            state.cache = outputs[self._cache_arg]
            logits = outputs.logits[0, -1].float()
            raw = torch.log_softmax(logits, dim=-1)
            token_id = _sample(torch, logits, params, state.generator)
        state.pending = [token_id]
        top: tuple[tuple[int, float], ...] = ()
        if params.top_logprobs:
            values, ids = torch.topk(raw, params.top_logprobs)
            top = tuple(zip(ids.tolist(), values.tolist()))
        return Step(token_id, float(raw[token_id]), top)


@dataclass
class _TorchState:
    pending: list[int]  # ids not yet fed to the model: the prompt, then the last sampled id
    generator: Any
    cache: Any = None


def _sample(torch: Any, logits: Any, params: SamplingParams, generator: Any) -> int:
    if params.temperature < GREEDY_EPS:
        return int(torch.argmax(logits))
    scores = logits / params.temperature
    if 0 < params.top_k < scores.numel():
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if params.min_p > 0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # drop a token when the mass before it already reaches top_p (keeps at least one)
        drop = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) >= params.top_p
        probs = probs.scatter(0, order, sorted_probs.masked_fill(drop, 0.0))
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))
