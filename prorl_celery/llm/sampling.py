"""``sampling_params``, split in this one place (DESIGN decision 11).

A ProRL Agent Server v1 trainer puts three kinds of keys in ``sampling_params``:

==============  ===================================================  ==========================
kind            keys                                                 what the service does
==============  ===================================================  ==========================
agent           ``max_iterations``, ``max_output_tokens``,           obeys them (turns, tokens
                ``max_input_tokens``, ``max_model_len``,             per turn, context caps,
                ``custom_tokenizer``, ``tokenizer``                  tokenizer); never sent
trainer-side    ``model``, ``api_key``, ``modify_params``,           accepts and ignores them;
                ``log_completions``, ``native_tool_calling``,        never sent
                ``token_level_generation``,
                ``ensure_thinking_end_properly``,
                ``strict_loop_detector``, ``is_reasoning_task``
sampler         :data:`SAMPLER_KEYS` of the backend's protocol       sent to the LLM server
==============  ===================================================  ==========================

Any other key is refused by the gateway (400, naming the closest known key: a misspelled
``max_token`` once trained on rollouts of the default length). An engine-specific key goes in
``sampling_params.extra``, an object sent to the LLM server as it is, on purpose. The result
lists every key that was not sent (``ignored_sampling_params``): trainer-side keys, and sampler
keys the chosen backend's protocol does not take. Nothing else outside a protocol's allow-list
ever reaches an LLM server.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

AGENT_KEYS = frozenset({"max_iterations", "max_output_tokens", "max_input_tokens", "max_model_len",
                        "custom_tokenizer", "tokenizer"})
TRAINER_KEYS = frozenset({"model", "api_key", "modify_params", "log_completions", "native_tool_calling",
                          "token_level_generation", "ensure_thinking_end_properly", "strict_loop_detector",
                          "is_reasoning_task"})

_COMMON = frozenset({"temperature", "top_p", "top_k", "min_p", "max_tokens", "seed", "stop",
                     "presence_penalty", "frequency_penalty", "repetition_penalty", "ignore_eos"})
#: per backend protocol: the sampler keys its adapter sends (under the protocol's own names)
SAMPLER_KEYS: dict[str, frozenset[str]] = {
    # vLLM's CompletionRequest sampling fields
    "vllm": _COMMON | {"stop_token_ids", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens",
                       "include_stop_str_in_output", "logit_bias", "bad_words"},
    # SGLang's SamplingParams (max_tokens -> max_new_tokens, seed -> sampling_seed, ...)
    "sglang": _COMMON | {"stop_token_ids", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens"},
    # llama-server /completion (max_tokens -> n_predict, repetition_penalty -> repeat_penalty)
    "llamacpp": _COMMON,
}
ANY_SAMPLER_KEY = frozenset().union(*SAMPLER_KEYS.values())
#: the object of engine-specific keys sent to the LLM server as they are
EXTRA_KEY = "extra"
KNOWN_KEYS = AGENT_KEYS | TRAINER_KEYS | ANY_SAMPLER_KEY | {EXTRA_KEY}


def unknown_key_message(key: str) -> str:
    """What the gateway says of a ``sampling_params`` key it does not know."""
    import difflib
    close = difflib.get_close_matches(key, sorted(KNOWN_KEYS), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return (f"unknown key {key!r}: {hint}engine-specific keys go in sampling_params.extra, which is sent to "
            f"the LLM server as it is")


@dataclass(frozen=True)
class SplitParams:
    """A request's ``sampling_params`` by kind; ``ignored`` lists what will never be sent."""

    sampler: dict[str, Any] = field(default_factory=dict)
    agent: dict[str, Any] = field(default_factory=dict)
    ignored: tuple[str, ...] = ()


def split(params: dict[str, Any]) -> SplitParams:
    """Sort every key into sampler, agent or ignored (trainer-side and unknown keys); None
    values count as absent, as v1 trainers send unset options as null."""
    sampler, agent, ignored = {}, {}, []
    for key, value in params.items():
        if key in AGENT_KEYS:
            if value is not None:
                agent[key] = value
        elif (key in ANY_SAMPLER_KEY and key not in TRAINER_KEYS) or key == EXTRA_KEY:
            if value is not None:
                sampler[key] = value
        else:
            ignored.append(key)
    return SplitParams(sampler, agent, tuple(sorted(ignored)))


def for_protocol(sampler: dict[str, Any], protocol: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The sampler keys ``protocol`` takes, with ``extra``'s keys as they are, and the names of
    those it does not take."""
    allowed = SAMPLER_KEYS[protocol]
    taken = {k: v for k, v in sampler.items() if k in allowed}
    taken.update({k: v for k, v in (sampler.get(EXTRA_KEY) or {}).items() if k not in taken})
    return taken, tuple(sorted(k for k in sampler if k not in allowed and k != EXTRA_KEY))


class UnresolvedTokenizer(ValueError):
    """``custom_tokenizer`` names no directory (and none under ``tokenizers_dir``)."""


def resolve_tokenizer(agent: dict[str, Any], default: str | None, tokenizers_dir: str | None) -> str | None:
    """The tokenizer directory a job uses: ``tokenizer``, else ``custom_tokenizer`` (a directory,
    or a name such as ``Qwen/Qwen3-8B`` looked up under ``tokenizers_dir`` by its full path, its
    last part, or with ``/`` as ``--``), else ``default``. UnresolvedTokenizer names the key when
    nothing matches."""
    if agent.get("tokenizer"):
        return str(agent["tokenizer"])
    name = agent.get("custom_tokenizer")
    if not name:
        return default
    candidates = [Path(name)]
    if tokenizers_dir:
        root = Path(tokenizers_dir)
        candidates += [root / name, root / Path(name).name, root / name.replace("/", "--")]
    for candidate in candidates:
        if candidate.is_dir():
            return str(candidate)
    where = f" nor under PRORL_TOKENIZERS_DIR ({tokenizers_dir})" if tokenizers_dir else \
        " (set PRORL_TOKENIZERS_DIR to resolve tokenizer names)"
    raise UnresolvedTokenizer(f"sampling_params.custom_tokenizer: {name!r} is not a directory{where}")
