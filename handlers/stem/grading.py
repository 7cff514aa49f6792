"""Grading of short STEM answers: normalized exact match (with aliases) or a numeric tolerance.

* ``exact``: SQuAD normalisation on both sides (lowercase, punctuation and the articles a/an/the
  removed, whitespace collapsed), then equality with the gold answer or any alias. Simple LaTeX
  wrappers (``\\text{...}``, ``\\mathrm{...}``, ``$``) are unwrapped first, since boxed answers
  carry them.
* ``numeric``: the first number in the prediction is compared with the gold number within a
  relative ``tolerance`` (``|pred - gold| <= tolerance * |gold|``; 0 means equal). Numbers may
  have thousands separators (``8,849``), scientific notation (``6.02e23``, ``6.02 × 10^23``,
  ``6.02\\times10^{23}``), a Unicode minus, and trailing units, which are ignored. A numeric
  question's aliases are tried as numbers too, and a prediction matching the gold text exactly
  (after normalisation) also counts.

``grade`` returns a :class:`Grade` whose ``details()`` go into the EVAL result: the normalized
prediction, the gold answers, and the kind of match.
"""
from __future__ import annotations

import math
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from handlers.math.grading import extract_boxed

ANSWER_TYPES = ("exact", "numeric")

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
_LATEX_WRAPPERS = re.compile(r"\\(?:text|mathrm|textrm|mathbf|textbf|operatorname)\s*\{([^{}]*)\}")
#: a number with optional thousands separators, decimals and exponent (e, × 10^, \times 10^{})
_NUMBER = re.compile(
    r"(?<![\w.])(?:10\s*(?:\^|\*\*)\s*\{?\s*(?P<power>[-+]?\d+)\s*\}?"  # a bare power of ten
    r"|(?P<mantissa>[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+)"
    r"(?:\s*(?:[eE](?P<e>[-+]?\d+)"
    r"|(?:\*|x|×|\\times|\\cdot|·)\s*10\s*(?:\^|\*\*)\s*\{?\s*(?P<p>[-+]?\d+)\s*\}?))?)"
)
_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+")
_SUPERSCRIPT_POWER = re.compile("10([⁻⁺]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+)")
_ANSWER_LINE = re.compile(r"(?im)^\s*(?:final\s+)?answer\s*[:：]\s*(.+?)\s*$")


@dataclass(frozen=True)
class Grade:
    correct: bool
    match: str  # "exact" | "alias" | "numeric" | "none" | "no_answer"
    prediction: str | None  # the normalized prediction (or the number read from it)
    gold: list[str]  # the gold answer first, then the aliases

    def details(self) -> dict[str, Any]:
        return {"correct": self.correct, "match": self.match, "normalized_prediction": self.prediction,
                "gold": self.gold}


def normalize_text(text: str) -> str:
    """SQuAD answer normalisation (after unwrapping simple LaTeX)."""
    text = _unlatex(text).lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def parse_number(text: str) -> float | None:
    """The first number in ``text`` (units and words around it ignored), or None."""
    cleaned = _unlatex(text).replace("−", "-").replace("–", "-").replace("\u2009", "").replace("{,}", ",")
    cleaned = re.sub(r"(?<=\d)[ \u00a0\u202f](?=\d{3}\b)", "", cleaned)  # 6 371 -> 6371
    cleaned = cleaned.replace("\\,", "").replace("\\!", "")
    cleaned = _SUPERSCRIPT_POWER.sub(lambda m: "10^" + m[1].translate(_SUPERSCRIPTS), cleaned)
    match = _NUMBER.search(cleaned)
    if match is None:
        return None
    # built as one literal: float() saturates to inf instead of raising on huge exponents
    if match["power"] is not None:
        value = float(f"1e{match['power']}")
    else:
        exponent = match["e"] or match["p"]
        value = float(match["mantissa"].replace(",", "") + (f"e{exponent}" if exponent else ""))
    return value if math.isfinite(value) else None


def numbers_close(prediction: float, gold: float, tolerance: float) -> bool:
    """Relative closeness; a zero gold needs an absolute ``tolerance``."""
    if tolerance <= 0:
        return prediction == gold
    scale = abs(gold) if gold != 0 else 1.0
    return abs(prediction - gold) <= tolerance * scale


def grade(prediction: str | None, answer: str, *, aliases: Sequence[str] = (), answer_type: str = "exact",
          tolerance: float = 0.0) -> Grade:
    """Grade ``prediction`` against the gold ``answer`` and its ``aliases``."""
    gold = [answer, *aliases]
    if prediction is None or not str(prediction).strip():
        return Grade(False, "no_answer", None, gold)
    prediction = str(prediction)
    normalized = normalize_text(prediction)
    if answer_type == "numeric":
        value = parse_number(prediction)
        targets = [parse_number(candidate) for candidate in gold]
        if value is not None and any(t is not None and numbers_close(value, t, tolerance) for t in targets):
            return Grade(True, "numeric", _format(value), gold)
        # words against words only ("two" for an alias "two"): stripping punctuation from numbers
        # would make "-18.015" equal "18.015"
        if value is None and normalized:
            if any(t is None and normalized == normalize_text(g) for g, t in zip(gold, targets)):
                return Grade(True, "exact", normalized, gold)
        return Grade(False, "none", _format(value) if value is not None else normalized, gold)
    if normalized == normalize_text(answer):
        return Grade(True, "exact", normalized, gold)
    if normalized and any(normalized == normalize_text(alias) for alias in aliases):
        return Grade(True, "alias", normalized, gold)
    return Grade(False, "none", normalized, gold)


def extract_answer(text: str) -> str | None:
    """A final answer written in a reply: the last ``\\boxed{}``, else the last "Answer: ..." line."""
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    # an "Answer:" drafted while thinking is only taken when none follows the reasoning
    for part in (text.rsplit("</think>", 1)[-1], text):
        lines = _ANSWER_LINE.findall(part)
        if lines:
            return lines[-1]
    return None


def _unlatex(text: str) -> str:
    previous = None
    while previous != text:  # nested wrappers: \text{\mathrm{x}}
        previous, text = text, _LATEX_WRAPPERS.sub(r"\1", text)
    return text.replace("$", "").replace("\\%", "%").strip()


def _format(value: float) -> str:
    return f"{value:.10g}"
