"""Request models and response shapes of the three protocols the server speaks.

Field names follow the real servers (vLLM ``protocol.py`` CompletionRequest/Response,
SGLang ``GenerateReqInput`` and ``SamplingParams``, llama.cpp ``tools/server`` README and
``server-task.cpp``). Unknown fields are rejected (400) instead of silently ignored, so a
client that sends a parameter the real server would not honour learns it here; fields the
real server accepts but this one cannot honour are accepted only at their no-op value.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from prorl_celery.dev.llm_server.engines import SamplingParams


class BadRequestError(ValueError):
    """Maps to HTTP 400 with ``{"error": {"message", "type", "code"}}``."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _no_stop_strings(value: Any) -> Any:
    if value:
        raise ValueError("stop strings are not supported by this server; use stop_token_ids")
    return value


StopStrings = Annotated[str | list[str] | None, AfterValidator(_no_stop_strings)]


def _no_op(neutral: float) -> Any:
    """A sampler option this server accepts only at its no-op value (penalties, min tokens)."""
    def check(value: Any) -> Any:
        if value is not None and value != neutral:
            raise ValueError(f"only {neutral} is supported by this server")
        return value
    return AfterValidator(check)


ZeroPenalty = Annotated[float | None, _no_op(0.0)]
UnitPenalty = Annotated[float | None, _no_op(1.0)]
NoMinTokens = Annotated[int | None, _no_op(0)]


# ----------------------------------------------------------------------------- vLLM


class VLLMCompletionRequest(_Strict):
    """``POST /v1/completions`` (vLLM's OpenAI-compatible server, one prompt, no streaming)."""

    model: str | None = None  # ignored: this server serves one model
    prompt: list[int] | str
    max_tokens: int | None = Field(default=16, ge=0)  # vLLM's default; null = rest of context
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = None
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    stop: StopStrings = None
    ignore_eos: bool = False
    presence_penalty: ZeroPenalty = None
    frequency_penalty: ZeroPenalty = None
    repetition_penalty: UnitPenalty = None
    min_tokens: NoMinTokens = None
    logprobs: int | None = Field(default=None, ge=0)
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    add_special_tokens: bool = True
    n: int = 1
    stream: Literal[False] = False
    echo: Literal[False] = False
    user: str | None = None
    request_id: str | None = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int) -> int:
        if value != 1:
            raise ValueError("n must be 1 on this server")
        return value


# ----------------------------------------------------------------------------- SGLang


class SGLangSamplingParams(_Strict):
    """SGLang's ``SamplingParams``: its seed is ``sampling_seed`` (``seed`` fails there too)."""

    max_new_tokens: int | None = Field(default=128, ge=0)
    temperature: float | None = Field(default=1.0, ge=0)
    top_p: float | None = Field(default=1.0, gt=0, le=1)
    top_k: int | None = -1
    min_p: float | None = Field(default=0.0, ge=0, le=1)
    stop: StopStrings = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    presence_penalty: ZeroPenalty = None
    frequency_penalty: ZeroPenalty = None
    repetition_penalty: UnitPenalty = None
    min_new_tokens: NoMinTokens = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None
    n: Literal[1] = 1


class SGLangGenerateRequest(_Strict):
    """``POST /generate`` (SGLang's native API, one prompt, no streaming)."""

    input_ids: list[int] | None = None
    text: str | None = None
    sampling_params: SGLangSamplingParams = Field(default_factory=SGLangSamplingParams)
    return_logprob: bool = False
    logprob_start_len: Literal[-1] = -1  # prompt logprobs are not supported
    top_logprobs_num: int = Field(default=0, ge=0)
    return_text_in_logprobs: bool = False
    stream: Literal[False] = False
    rid: str | None = None


# ----------------------------------------------------------------------------- llama.cpp


class LlamaCppCompletionRequest(_Strict):
    """``POST /completion`` (llama.cpp ``llama-server``'s native API, one prompt, no streaming)."""

    prompt: list[int] | str
    n_predict: int = Field(default=-1, ge=-1)
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = Field(default=0.95, gt=0, le=1)
    min_p: float = Field(default=0.05, ge=0, le=1)
    seed: int = -1
    n_probs: int = Field(default=0, ge=0)
    return_tokens: bool = False
    cache_prompt: bool = True  # accepted; this server keeps no cache between requests
    ignore_eos: bool = False
    stop: StopStrings = None
    presence_penalty: ZeroPenalty = None
    frequency_penalty: ZeroPenalty = None
    repeat_penalty: UnitPenalty = None
    post_sampling_probs: Literal[False] = False
    id_slot: int = -1
    stream: Literal[False] = False


# ----------------------------------------------------------------------------- results


@dataclass
class Generation:
    """One request as the server saw it; also the ``/_log`` record."""

    request_id: str
    protocol: str
    prompt_ids: list[int]
    params: SamplingParams
    started: float
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    #: the id that stopped generation: eos, a stop id, or None
    stop_token: int | None = None
    #: True when ``stop_token`` is the tokenizer's eos (vLLM reports stop_reason None then)
    stopped_on_eos: bool = False
    aborted: bool = False
    finished: float | None = None
    #: the fields of the request body the client sent (``parent.child`` for nested ones)
    request_keys: list[str] = field(default_factory=list)

    def log_record(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "protocol": self.protocol,
                "prompt_ids": self.prompt_ids, "output_ids": self.output_ids,
                "logprobs": self.logprobs, "aborted": self.aborted, "started": self.started,
                "finished": self.finished, "finish_reason": self.finish_reason,
                "request_keys": self.request_keys, "max_tokens": self.params.max_tokens}

    def text_ids(self, *, trim_stop: bool = True) -> list[int]:
        """Output ids that make up the text: the stop token is not part of it."""
        if trim_stop and self.stop_token is not None and self.output_ids:
            return self.output_ids[:-1]
        return self.output_ids


_BYTE_DECODER: dict[str, int] | None = None


def _byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level BPE: the printable character standing for each raw byte."""
    global _BYTE_DECODER
    if _BYTE_DECODER is None:
        keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                *range(ord("®"), ord("ÿ") + 1)]
        chars, extra = list(keep), 0
        for byte in range(256):
            if byte not in keep:
                keep.append(byte)
                chars.append(256 + extra)
                extra += 1
        _BYTE_DECODER = {chr(c): b for b, c in zip(keep, chars)}
    return _BYTE_DECODER


class TokenText:
    """Per-token strings and bytes the way each server reports them."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self.special = set(tokenizer.all_special_ids) | {i for i, t in added.items() if t.special}
        self.added = {i: t.content for i, t in added.items()}

    def piece(self, token_id: int) -> str:
        """``decode([id])`` keeping special tokens (vLLM logprob tokens, SGLang texts)."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def raw_bytes(self, token_id: int) -> bytes:
        """The token's bytes as llama.cpp renders it (control tokens render empty)."""
        if token_id in self.special:
            return b""
        if token_id in self.added:
            return self.added[token_id].encode()
        piece = self.tokenizer.convert_ids_to_tokens(token_id) or ""
        decoder = _byte_decoder()
        if all(ch in decoder for ch in piece):
            return bytes(decoder[ch] for ch in piece)
        return self.piece(token_id).encode()  # not a byte-level BPE vocabulary

    def text(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


# ----------------------------------------------------------------------------- responses


def vllm_response(gen: Generation, req: VLLMCompletionRequest, tt: TokenText,
                  model: str) -> dict[str, Any]:
    """vLLM's CompletionResponse, every field present as vLLM serialises it."""
    ids = gen.output_ids
    logprobs = None
    if req.logprobs is not None:
        name = (lambda i: f"token_id:{i}") if req.return_tokens_as_token_ids else tt.piece
        tokens = [name(i) for i in ids]
        offsets, at = [], 0
        for token in tokens:
            offsets.append(at)
            at += len(token)
        # as vLLM: the sampled token first, then the top ``logprobs`` alternatives
        tops = [{name(t): max(lp, -9999.0) for t, lp in ((i, sampled), *top[:req.logprobs])}
                for i, sampled, top in zip(ids, gen.logprobs, gen.tops)]
        logprobs = {"text_offset": offsets,
                    "token_logprobs": [max(lp, -9999.0) for lp in gen.logprobs],
                    "tokens": tokens, "top_logprobs": tops}
    stop_reason = None if gen.stopped_on_eos else gen.stop_token
    choice = {"index": 0,
              "text": tt.text(gen.text_ids(), skip_special_tokens=req.skip_special_tokens),
              "logprobs": logprobs, "finish_reason": gen.finish_reason, "stop_reason": stop_reason,
              "token_ids": ids if req.return_token_ids else None, "prompt_logprobs": None,
              "prompt_token_ids": gen.prompt_ids if req.return_token_ids else None}
    usage = {"prompt_tokens": len(gen.prompt_ids), "total_tokens": len(gen.prompt_ids) + len(ids),
             "completion_tokens": len(ids), "prompt_tokens_details": None}
    return {"id": f"cmpl-{gen.request_id}", "object": "text_completion",
            "created": int(gen.started), "model": model, "choices": [choice],
            "service_tier": None, "system_fingerprint": None, "usage": usage,
            "kv_transfer_params": None}


def sglang_response(gen: Generation, req: SGLangGenerateRequest, tt: TokenText) -> dict[str, Any]:
    """SGLang's ``/generate`` answer for one prompt."""
    sampling, ids = req.sampling_params, gen.output_ids
    if gen.finish_reason == "length":
        finish: dict[str, Any] = {"type": "length", "length": len(ids)}
    else:
        finish = {"type": "stop", "matched": gen.stop_token}
    meta: dict[str, Any] = {
        "id": gen.request_id, "finish_reason": finish, "prompt_tokens": len(gen.prompt_ids),
        "completion_tokens": len(ids), "cached_tokens": 0,
        "e2e_latency": round((gen.finished or gen.started) - gen.started, 6)}
    if req.return_logprob:
        text = tt.piece if req.return_text_in_logprobs else (lambda i: None)
        meta["output_token_logprobs"] = [[lp, i, text(i)] for i, lp in zip(ids, gen.logprobs)]
        if req.top_logprobs_num:
            meta["output_top_logprobs"] = [[[lp, t, text(t)] for t, lp in top] for top in gen.tops]
    body = tt.text(gen.text_ids(trim_stop=not sampling.no_stop_trim),
                   skip_special_tokens=sampling.skip_special_tokens)
    return {"text": body, "output_ids": ids, "meta_info": meta}


def llamacpp_response(gen: Generation, req: LlamaCppCompletionRequest, tt: TokenText,
                      model: str) -> dict[str, Any]:
    """llama-server's ``/completion`` answer (non-OAI, non-streaming)."""
    ids = gen.output_ids
    content = tt.text(gen.text_ids())
    elapsed_ms = ((gen.finished or gen.started) - gen.started) * 1000.0
    body: dict[str, Any] = {
        "index": 0, "content": content, "tokens": ids if req.return_tokens else [], "id_slot": 0,
        "stop": True, "model": model, "tokens_predicted": len(ids),
        "tokens_evaluated": len(gen.prompt_ids),
        "generation_settings": {"n_predict": req.n_predict, "seed": req.seed,
                                "temperature": req.temperature, "top_k": req.top_k,
                                "top_p": req.top_p, "min_p": req.min_p, "n_probs": req.n_probs,
                                "ignore_eos": req.ignore_eos, "stream": False},
        "prompt": tt.text(gen.prompt_ids, skip_special_tokens=False),
        "has_new_line": "\n" in content,
        "truncated": False, "stop_type": "limit" if gen.finish_reason == "length" else "eos",
        "stopping_word": "", "tokens_cached": 0,
        "timings": {"prompt_n": len(gen.prompt_ids), "predicted_n": len(ids),
                    "predicted_ms": round(elapsed_ms, 3)}}
    if req.n_probs > 0:
        body["completion_probabilities"] = _llamacpp_probabilities(gen, tt, req.n_probs)
    return body


def _llamacpp_probabilities(gen: Generation, tt: TokenText, n_probs: int) -> list[dict[str, Any]]:
    """One entry per reported piece of text, as llama-server builds them: a token whose bytes
    end inside a UTF-8 character is held back and reported with the tokens that complete it,
    as one entry carrying the last token's id and logprob and every byte of the run. So byte-
    fallback tokens give fewer entries than tokens (what real servers do, kept on purpose)."""
    entries: list[dict[str, Any]] = []
    held = b""
    for position, (token_id, logprob, top) in enumerate(zip(gen.output_ids, gen.logprobs, gen.tops)):
        raw = held + tt.raw_bytes(token_id)
        if _ends_inside_character(raw) and position < len(gen.output_ids) - 1:
            held = raw
            continue
        held = b""
        entries.append({"id": token_id, "token": raw.decode("utf-8", errors="ignore"), "bytes": list(raw),
                        "logprob": logprob,
                        "top_logprobs": [_llamacpp_prob(tt, t, tlp) for t, tlp in top[:n_probs]]})
    return entries


def _ends_inside_character(raw: bytes) -> bool:
    """True when the last bytes start a UTF-8 sequence that is not complete yet."""
    for back in range(1, min(4, len(raw)) + 1):
        byte = raw[-back]
        if byte & 0xC0 == 0x80:  # continuation byte: look further back for the lead byte
            continue
        needed = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        return needed > back
    return False


def _llamacpp_prob(tt: TokenText, token_id: int, logprob: float) -> dict[str, Any]:
    raw = tt.raw_bytes(token_id)
    # llama.cpp cuts an incomplete UTF-8 sequence off the string but keeps every byte
    return {"id": token_id, "token": raw.decode("utf-8", errors="ignore"), "bytes": list(raw),
            "logprob": logprob}
