"""Turn a STEM question, in any accepted shape, into messages + a gold answer and its grading rule.

Accepted shapes:

plain question (the shipped ``data/questions.jsonl``)
    ``{"question": str, "answer": str | number | [str, ...]}`` (``problem`` / ``query`` may name
    the question). Optional: ``aliases`` (other accepted answers), ``answer_type`` (``"exact"`` |
    ``"numeric"``), ``tolerance`` (relative, for numeric answers), ``supporting_doc_ids``,
    ``id``. A list answer is the answer followed by aliases.
multiple choice (ScienceQA-style)
    a plain question with ``choices: [str, ...]`` and ``answer`` the index of the right choice
    (ScienceQA) or its letter. The choices are listed as (A), (B), ... in the prompt; the letter
    and the choice's text are both accepted.
verl row (WebInstruct-verified, GPQA and other rule-graded sets)
    ``{"data_source": str, "prompt": [{"role", "content"}, ...],
    "reward_model": {"style": "rule", "ground_truth": str | number | [str, ...] | {"answer",
    "aliases", "answer_type", "tolerance"}}, "extra_info": {...}}``; ``extra_info`` may carry
    ``answer_type`` (WebInstruct's ``Float`` / ``Integer`` / ``Percentage`` count as numeric,
    anything else as exact), ``tolerance`` and ``aliases``. The prompt is used unchanged.

Without an ``answer_type`` a gold answer that is a bare number is numeric and anything else is
exact; without a ``tolerance`` an integer gold must match exactly and any other number within
1 % (``DEFAULT_TOLERANCE``). ``max_iterations`` (model turns, default 8, capped at 16) may be set
in either shape.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from handlers.rows import parse_row, read_max_iterations, verl_row
from handlers.stem.grading import ANSWER_TYPES

SYSTEM_PROMPT = (
    "You answer science questions with the help of tools. Use `search` to look up facts in the "
    "reference documents (short encyclopedic passages) and `python` for any calculation; take "
    "constants and data from the reference documents. When you know the answer, call `finish` with "
    "only the final answer: a number in the unit the question asks for, or a short name or phrase."
)
CHOICE_SUFFIX = "Answer with the letter of the correct choice."

DEFAULT_MAX_ITERATIONS = 8
MAX_ITERATIONS_CAP = 16
DEFAULT_TOLERANCE = 0.01
QUESTION_KEYS = ("question", "problem", "query")
#: WebInstruct-verified ``answer_type`` values graded as numbers
NUMERIC_TYPE_NAMES = frozenset({"numeric", "number", "float", "integer", "percentage"})
_BARE_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+(?:[eE][-+]?\d+)?")
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

SHAPE_HINT = "instance needs either 'question' and 'answer' or 'prompt' and 'reward_model.ground_truth'"


@dataclass(frozen=True)
class StemInstance:
    """A STEM question in the one shape the handler works with."""

    messages: list[dict[str, Any]]
    answer: str
    aliases: list[str] = field(default_factory=list)
    answer_type: str = "exact"
    tolerance: float = 0.0
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    metadata: dict[str, Any] = field(default_factory=dict)

    def gold(self) -> dict[str, Any]:
        """What EVAL needs to grade (kept in ``init_result``)."""
        return {"answer": self.answer, "aliases": self.aliases, "answer_type": self.answer_type,
                "tolerance": self.tolerance}


def normalize_instance(instance: Any) -> StemInstance:
    """Return the instance in the handler's shape; ValueError names the bad field."""
    return parse_row(instance, verl=_from_verl_row, plain=_from_plain)


def validate_instance(instance: Any) -> None:
    normalize_instance(instance)


def default_messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question.strip()}]


def _max_iterations(instance: dict[str, Any]) -> int:
    return read_max_iterations(instance, DEFAULT_MAX_ITERATIONS, MAX_ITERATIONS_CAP)


def _from_plain(instance: dict[str, Any]) -> StemInstance:
    max_iterations = _max_iterations(instance)
    key = next((k for k in QUESTION_KEYS if instance.get(k) is not None), None)
    if key is None:
        raise ValueError(SHAPE_HINT)
    question = instance[key]
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"field '{key}' must be a non-empty string")
    if "answer" not in instance:
        raise ValueError(f"field 'answer' is missing; {SHAPE_HINT}")
    aliases = _string_list(instance.get("aliases", []), "aliases")
    if instance.get("choices") is not None:
        question, answer, choice_aliases = _multiple_choice(question, instance["choices"], instance["answer"])
        aliases = [*choice_aliases, *aliases]
        answer_type = _answer_type(instance.get("answer_type", "exact"), "answer_type")
    else:
        answer, extra = _gold_answer(instance["answer"], "answer")
        aliases = [*extra, *aliases]
        answer_type = _answer_type(instance.get("answer_type"), "answer_type", answer)
    tolerance = _tolerance(instance.get("tolerance"), "tolerance", answer)
    docs = _string_list(instance.get("supporting_doc_ids", []), "supporting_doc_ids")
    metadata = {"format": "plain", "supporting_doc_ids": docs,
                **{k: instance[k] for k in ("id", "data_source") if isinstance(instance.get(k), (str, int))}}
    return StemInstance(default_messages(question), answer, aliases, answer_type, tolerance, max_iterations,
                        metadata)


def _from_verl_row(instance: dict[str, Any]) -> StemInstance:
    max_iterations = _max_iterations(instance)
    row = verl_row(instance, SHAPE_HINT)
    messages, truth = row.messages, row.ground_truth
    rule: dict[str, Any] = dict(row.extra_info)
    where = "reward_model.ground_truth"
    if isinstance(truth, dict):
        if "answer" not in truth:
            raise ValueError(f"field '{where}.answer' is missing")
        rule.update({k: v for k, v in truth.items() if k in ("aliases", "answer_type", "tolerance")})
        truth, where = truth["answer"], f"{where}.answer"
    answer, extra = _gold_answer(truth, where)
    aliases = [*extra, *_string_list(rule.get("aliases", []), "extra_info.aliases")]
    answer_type = _answer_type(rule.get("answer_type"), "extra_info.answer_type", answer)
    tolerance = _tolerance(rule.get("tolerance"), "extra_info.tolerance", answer)
    metadata = row.metadata
    return StemInstance(messages, answer, aliases, answer_type, tolerance, max_iterations, metadata)


def _multiple_choice(question: str, choices: Any, answer: Any) -> tuple[str, str, list[str]]:
    if (not isinstance(choices, list) or not 2 <= len(choices) <= len(_LETTERS)
            or not all(isinstance(c, str) and c.strip() for c in choices)):
        raise ValueError("field 'choices' must be a list of 2 to 26 non-empty strings")
    if isinstance(answer, int) and not isinstance(answer, bool):
        index = answer
    elif isinstance(answer, str) and answer.strip().upper() in _LETTERS[: len(choices)] and answer.strip():
        index = _LETTERS.index(answer.strip().upper())
    else:
        index = -1
    if not 0 <= index < len(choices):
        raise ValueError(f"field 'answer' must be a choice index (0 to {len(choices) - 1}) or letter")
    listed = "\n".join(f"({_LETTERS[i]}) {choice}" for i, choice in enumerate(choices))
    letter = _LETTERS[index]
    return f"{question.strip()}\n\n{listed}\n\n{CHOICE_SUFFIX}", letter, [f"({letter})", choices[index]]


def _gold_answer(value: Any, key: str) -> tuple[str, list[str]]:
    if isinstance(value, list):
        if not value:
            raise ValueError(f"field '{key}' must not be an empty list")
        answers = [_answer_string(v, f"{key}[{i}]") for i, v in enumerate(value)]
        return answers[0], answers[1:]
    return _answer_string(value, key), []


def _answer_string(value: Any, key: str) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value) if isinstance(value, float) else str(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"field '{key}' must be a non-empty string or a number")
    return value.strip()


def _answer_type(value: Any, key: str, answer: str | None = None) -> str:
    if value is None:
        return "numeric" if answer is not None and _BARE_NUMBER.fullmatch(answer) else "exact"
    if not isinstance(value, str):
        raise ValueError(f"field '{key}' must be one of {', '.join(ANSWER_TYPES)}")
    lowered = value.strip().lower()
    if key.startswith("extra_info"):  # public sets name their own types; unknown ones are text
        return "numeric" if lowered in NUMERIC_TYPE_NAMES else "exact"
    if lowered not in ANSWER_TYPES:
        raise ValueError(f"field '{key}' must be one of {', '.join(ANSWER_TYPES)}, got {value!r}")
    return lowered


def _tolerance(value: Any, key: str, answer: str) -> float:
    if value is None:
        integer = _BARE_NUMBER.fullmatch(answer) and not re.search(r"[.eE]", answer)
        return 0.0 if integer else DEFAULT_TOLERANCE
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"field '{key}' must be a relative tolerance between 0 and 1, got {value!r}")
    return float(value)


def _string_list(value: Any, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError(f"field '{key}' must be a list of non-empty strings")
    return [v.strip() for v in value]


