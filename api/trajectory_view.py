"""The trajectory viewer's model of one job: turns, token runs, token view, fidelity, artifacts.

Everything returned here is plain data; the template renders it with autoescaping, so text
from a model or a tool can never become markup.
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
from typing import Any

from handlers.tool_calls import ToolCallError, parse_tool_calls
from prorl_celery.core.status import JobStatus
from prorl_celery.llm.fidelity import check_trajectory
from prorl_celery.llm.tokenizer import ChatTokenizer, load_tokenizer

log = logging.getLogger(__name__)

#: tokens shown in the token view; a longer trajectory shows its first ones and says so
TOKEN_VIEW_LIMIT = 20_000
#: logprob shown with the darkest shade in the token view
LOGPROB_FLOOR = -10.0
#: observations longer than this (characters or lines) start folded
FOLD_CHARS = 800
FOLD_LINES = 16

_THINK = re.compile(r"^\s*<think>(.*?)(?:</think>|$)", re.DOTALL)
_TOOL_BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|$)", re.DOTALL)
_failed_paths: set[str] = set()
_failed_lock = threading.Lock()


# -- tokenizer -------------------------------------------------------------------------------------

def tokenizer_for(trajectory: dict[str, Any] | None, default: str | None) -> tuple[ChatTokenizer | None, str]:
    """The tokenizer that produced the trajectory (its recorded directory, else the gateway's
    ``PRORL_TOKENIZER``), and a note saying which one or why there is none."""
    candidates = [p for p in ((trajectory or {}).get("tokenizer"), default) if p]
    for path in dict.fromkeys(candidates):
        if not os.path.isdir(path) or path in _failed_paths:
            continue
        try:
            return load_tokenizer(path), f"decoded with {path}"
        except Exception as error:  # noqa: BLE001 - any loading failure means "ids only"
            log.warning("dashboard: cannot load tokenizer %s: %s", path, error)
            with _failed_lock:
                _failed_paths.add(path)
    tried = ", ".join(candidates) or "none recorded and PRORL_TOKENIZER unset"
    return None, f"token ids only: the gateway cannot load the tokenizer ({tried})"


# -- conversation ----------------------------------------------------------------------------------

def conversation(result: dict[str, Any]) -> dict[str, Any]:
    """Messages turn by turn, each with its role, text, reasoning, tool calls and token count.

    Token counts come from the trajectory: the prompt's ids for the first messages, each model
    turn's ``output_len``, and the observation ids between two model turns for the messages
    that came between them (one count for the group when several did).
    """
    trajectory = result.get("trajectory") or {}
    messages = result.get("messages") or trajectory.get("messages") or []
    turns = trajectory.get("turns") or []
    runs = observation_runs(trajectory)
    entries: list[dict[str, Any]] = []
    model_turn = -1
    group: list[dict[str, Any]] = []

    def close_group() -> None:
        """The messages since the last model turn share one count: the prompt's ids before
        the first model turn, else the observation ids after that turn."""
        if group:
            first = model_turn < 0
            group[-1]["group_tokens"] = len(trajectory.get("prompt_ids") or []) if first else runs.get(model_turn)
            group[-1]["group_kind"] = "prompt" if first else "observation"
            group[-1]["group_size"] = len(group)
        group.clear()

    for index, message in enumerate(messages):
        entry = _message_entry(index, message)
        if message.get("role") == "assistant":
            close_group()
            model_turn += 1
            turn = turns[model_turn] if model_turn < len(turns) else {}
            entry["tokens"] = turn.get("output_len")
            entry["finish_reason"] = turn.get("finish_reason")
            entry["turn"] = model_turn + 1
        else:
            group.append(entry)
        entries.append(entry)
    close_group()
    return {"messages": entries, "num_turns": trajectory.get("num_turns", len(turns)),
            "has_trajectory": bool(trajectory)}


def observation_runs(trajectory: dict[str, Any]) -> dict[int, int]:
    """Observation tokens (mask 0) after each model turn, by turn index."""
    mask = trajectory.get("response_mask") or []
    turns = trajectory.get("turns") or []
    runs: dict[int, int] = {}
    for index, turn in enumerate(turns):
        end = turn.get("output_start", 0) + turn.get("output_len", 0)
        stop = turns[index + 1].get("output_start", len(mask)) if index + 1 < len(turns) else len(mask)
        runs[index] = sum(1 for m in mask[end:stop] if m == 0)
    return runs


def _message_entry(index: int, message: dict[str, Any]) -> dict[str, Any]:
    role = str(message.get("role", "?"))
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content, indent=2, ensure_ascii=False)
    entry: dict[str, Any] = {"index": index, "role": role, "text": text, "reasoning": None, "tool_calls": [],
                             "tokens": None, "group_tokens": None, "group_kind": None, "group_size": 0,
                             "turn": None, "finish_reason": None, "extra": {k: v for k, v in message.items()
                                                       if k not in {"role", "content"}}}
    if role == "assistant":
        think = _THINK.match(text)
        if think:
            entry["reasoning"] = think.group(1).strip()
            text = text[think.end():]
        for call in parse_tool_calls(text):
            if isinstance(call, ToolCallError):
                entry["tool_calls"].append({"name": None, "arguments": None, "error": call.message})
            else:
                entry["tool_calls"].append({"name": call.name, "error": None,
                                            "arguments": _pretty_arguments(call.arguments)})
        entry["text"] = _TOOL_BLOCK.sub("", text).strip() if entry["tool_calls"] else text.strip()
    entry["fold"] = role not in {"assistant", "system"} and (
        len(entry["text"]) > FOLD_CHARS or entry["text"].count("\n") > FOLD_LINES)
    return entry


def _pretty_arguments(arguments: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, value) pairs; string values (code) kept as written so they read as code."""
    return [(k, v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)) for k, v in arguments.items()]


# -- token view ------------------------------------------------------------------------------------

def token_view(trajectory: dict[str, Any] | None, tokenizer: ChatTokenizer | None) -> dict[str, Any]:
    """Every id of ``prompt_ids + response_ids`` with its kind (prompt, model, observation),
    its logprob (model tokens) and, when the tokenizer loads, its text."""
    trajectory = trajectory or {}
    prompt = list(trajectory.get("prompt_ids") or [])
    response = list(trajectory.get("response_ids") or [])
    mask = list(trajectory.get("response_mask") or [])
    logprobs = list(trajectory.get("response_logprobs") or [])
    total = len(prompt) + len(response)
    tokens: list[dict[str, Any]] = []
    for position, token_id in enumerate(prompt[:TOKEN_VIEW_LIMIT]):
        tokens.append({"id": token_id, "kind": "prompt", "pos": position})
    for offset, token_id in enumerate(response[:max(0, TOKEN_VIEW_LIMIT - len(prompt))]):
        model = offset < len(mask) and mask[offset] == 1
        token = {"id": token_id, "kind": "model" if model else "obs", "pos": len(prompt) + offset}
        if model and offset < len(logprobs) and logprobs[offset] is not None:
            token["logprob"] = float(logprobs[offset])
            # shade on the logprob itself (0 -> 1, LOGPROB_FLOOR or lower -> 0): on a probability
            # scale every token below p = 0.5 would look the same
            token["level"] = round(min(1.0, max(0.0, 1.0 - token["logprob"] / LOGPROB_FLOOR)), 3)
        tokens.append(token)
    if tokenizer is not None:
        for token in tokens:
            token["text"] = _visible(tokenizer.decode([token["id"]], skip_special_tokens=False))
    counts = {"prompt": len(prompt), "model": sum(1 for m in mask if m == 1),
              "obs": sum(1 for m in mask if m != 1)}
    return {"tokens": tokens, "total": total, "shown": len(tokens), "counts": counts,
            "decoded": tokenizer is not None}


def _visible(text: str) -> str:
    """Whitespace-only pieces would be invisible: show newlines and tabs as marks too."""
    return text.replace("\n", "\u21b5\n").replace("\t", "\u21e5\t")


def fidelity(trajectory: dict[str, Any] | None, tokenizer: ChatTokenizer | None) -> dict[str, Any] | None:
    """The re-tokenization check's verdict (see ``prorl tokens check``), or None without a
    tokenizer or a trajectory."""
    if tokenizer is None or not trajectory or not trajectory.get("messages"):
        return None
    try:
        report = check_trajectory(tokenizer, trajectory)
    except Exception as error:  # noqa: BLE001 - a template that cannot render is a verdict too
        return {"match": False, "verdict": f"check failed: {type(error).__name__}: {error}", "divergence": None}
    verdict = {"match": report.match, "verdict": report.describe(tokenizer), "divergence": report.first_divergence,
               "expected": False}
    if not report.match and THINK_OPEN in tokenizer.decode(report.expected, False):
        # Qwen3's template drops the <think> blocks of earlier turns when it renders history: the
        # re-rendered text must differ there, while the trajectory keeps the ids the model produced
        verdict["expected"] = True
        verdict["note"] = ("Expected: this chat template drops earlier turns' <think> blocks when it "
                           "re-renders history, so a text pipeline would drift here. The trajectory "
                           "keeps the ids the model produced, so training is not affected.")
    return verdict


#: the reasoning block a template may strip from earlier turns (Qwen3)
THINK_OPEN = "<think>"


def no_messages_reason(result: dict[str, Any]) -> str:
    """Why a job's page has no conversation, from where the job got to."""
    reached_run = bool((result.get("nodes") or {}).get("run")) or bool((result.get("timing") or {}).get("run_s"))
    ended_in = result.get("outcome_stage")
    if result.get("status") == "cancelled":
        return ("it was cancelled during RUN, before its first model turn ended" if reached_run
                else "it was cancelled before RUN started")
    if not reached_run and ended_in != "run":
        return ("it has not reached RUN yet" if not JobStatus(result["status"]).terminal
                else f"it ended in {ended_in or 'INIT'} before RUN started")
    return "its RUN ended before the first model turn did"


# -- artifacts -------------------------------------------------------------------------------------

def artifacts(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each artifact as a diff (unified patch), plain text, or JSON."""
    shown = []
    for name, value in (result.get("artifacts") or {}).items():
        if isinstance(value, str) and _looks_like_diff(value):
            shown.append({"name": name, "kind": "diff", "lines": [(_diff_class(line), line)
                                                                   for line in value.splitlines()]})
        elif isinstance(value, str):
            shown.append({"name": name, "kind": "text", "text": value})
        else:
            shown.append({"name": name, "kind": "json", "text": json.dumps(value, indent=2, ensure_ascii=False)})
    return shown


def _looks_like_diff(text: str) -> bool:
    return text.startswith(("diff --git", "--- ", "Index: ")) or ("\n@@ " in text and "\n+++ " in text)


def _diff_class(line: str) -> str:
    if line.startswith(("+++", "---", "diff ", "index ")):
        return "meta"
    if line.startswith("@@"):
        return "hunk"
    if line.startswith("+"):
        return "add"
    if line.startswith("-"):
        return "del"
    return "ctx"
