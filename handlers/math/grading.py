"""Answer extraction and equivalence checking for math problems.

``extract_boxed`` finds the model's final answer; ``is_equivalent`` decides whether it matches
the ground truth, with math-verify first and a normalised-string / exact-number fallback.

Threads: math-verify's own timeouts use ``signal.alarm``, which raises in any thread but the
main one (Celery thread pools). They are switched off here (``parsing_timeout=None``,
``timeout_seconds=None``) and replaced by a static guard, ``symbolic_check_refused``, that
keeps inputs known to make sympy run for minutes (power towers, huge polynomial powers, huge
factorials, very long strings) away from the symbolic path. A refused input is still graded,
by the string/number fallback only. Nothing here ever ``eval``s model output.
"""
from __future__ import annotations

import logging
import re
from fractions import Fraction

from prorl_celery.core.errors import EvalUnavailable

logger = logging.getLogger(__name__)

#: Longest answer (or ground truth) given to the symbolic checker; final answers are short.
MAX_SYMBOLIC_CHARS = 400
#: Largest integer exponent allowed on a plain-number base (``2^{2024}`` is a real answer).
MAX_NUMERIC_EXPONENT = 10_000
#: Largest integer exponent allowed on anything else: ``(x+1)^{1000}`` takes seconds to expand.
MAX_SYMBOLIC_EXPONENT = 300
#: Largest ``n!`` computed: ``10^6!`` takes seconds.
MAX_FACTORIAL = 100_000

_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_THINK_END = "</think>"


def extract_boxed(text: str) -> str | None:
    """Return the content of the last non-empty ``\\boxed{...}`` (or ``\\fbox{...}``) in text.

    Nested braces are matched; escaped braces (``\\{``) do not count. ``\\boxed 5`` (no braces)
    yields the token up to the next space or ``$``. A box whose braces never close (a reply cut
    off at max_tokens) is ignored.

    Reasoning models write drafts inside ``<think>...</think>``, and a draft may box a guess
    that the model later rejects. So when there is a box after the last ``</think>``, that box is
    the answer and the reasoning is ignored. Only when nothing is boxed after it (or there is
    no closing tag, e.g. the reply was cut off mid-thought) is the last box anywhere taken,
    since a boxed conclusion the model reached while thinking is still its best final answer.
    """
    if _THINK_END in text:
        after = _last_box(text.rsplit(_THINK_END, 1)[1])
        if after is not None:
            return after
    return _last_box(text)


def _last_box(text: str) -> str | None:
    found = None
    for match in _BOX_COMMAND.finditer(text):
        content = _box_content(text, match.end())
        if content:
            found = content
    return found


def _box_content(text: str, start: int) -> str | None:
    """Content of the box whose command ends at ``start``, or None when it is malformed."""
    i = start
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] == "{":
        end = _matching_brace(text, i)
        return None if end is None else text[i + 1 : end].strip()
    if i == start:  # "\boxedx" is another command, not a box
        return None
    token = re.match(r"[^\s$]+", text[i:])
    return token.group(0) if token else None


def _matching_brace(text: str, open_at: int) -> int | None:
    depth = 0
    i = open_at
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2  # "\{" and "\}" are literal braces of a set, not grouping
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def is_equivalent(answer: str | None, ground_truth: str | None) -> bool:
    """True when ``answer`` is mathematically the same as ``ground_truth``.

    Both may be bare LaTeX (``\\frac{1}{2}``), ``$...$`` or contain ``\\boxed{}``. Tries, in
    order: normalised string equality, exact number equality, then math-verify (symbolic,
    numeric to 6 decimals, intervals, sets, equations such as ``x=3`` vs ``3``). Safe to call
    from any thread. Raises ``EvalUnavailable`` when math-verify fails on the pair: a grader that
    cannot judge never answers False.
    """
    if answer is None or ground_truth is None:
        return False
    answer, ground_truth = _unwrap(answer), _unwrap(ground_truth)
    if not answer or not ground_truth:
        return False
    if _string_equivalent(answer, ground_truth):
        return True
    refused = symbolic_check_refused(answer) or symbolic_check_refused(ground_truth)
    if refused:
        logger.debug("symbolic check skipped (%s): %r vs %r", refused, answer, ground_truth)
        return False
    return _math_verify_equivalent(answer, ground_truth)


def _unwrap(text: str) -> str:
    """Strip a ``\\boxed{}`` wrapper and math delimiters: graders compare bare expressions."""
    text = text.strip()
    if _BOX_COMMAND.search(text):
        text = extract_boxed(text) or ""
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(text) >= len(left) + len(right) and text.startswith(left) and text.endswith(right):
            text = text[len(left) : len(text) - len(right)]
            break
    return text.strip()


def _math_verify_equivalent(answer: str, ground_truth: str) -> bool:
    # imported here, not at module level: math_verify pulls in sympy (40 MB, 0.5 s), which only
    # EVAL needs; EVAL workers import it at start-up (prorl_celery.worker.signals)
    from math_verify import parse, verify

    try:
        # Boxing makes math-verify's LaTeX extractor take the whole string as one answer.
        gold = parse(f"\\boxed{{{ground_truth}}}", parsing_timeout=None)
        pred = parse(f"\\boxed{{{answer}}}", parsing_timeout=None)
        return bool(gold and pred and verify(gold, pred, timeout_seconds=None))
    except Exception as error:  # the grader could not judge: never a reward of 0
        logger.warning("math-verify failed on %r vs %r", answer, ground_truth, exc_info=True)
        raise EvalUnavailable(f"math-verify could not compare {answer[:80]!r} with the ground truth: "
                              f"{type(error).__name__}: {error}") from error


_EXPONENT = re.compile(r"\^\s*(\{|\\?[A-Za-z0-9])")
_INTEGER = re.compile(r"\d+")
_FACTORIAL = re.compile(r"(\d+)\s*(?:\)|\\right\))?\s*!")


def symbolic_check_refused(expr: str) -> str | None:
    """Why ``expr`` must not reach sympy, or None when it is safe.

    A static stand-in for math-verify's signal-based timeout, which cannot run in threads.
    Conservative on purpose: a refused answer can still match by string or number.
    """
    if len(expr) > MAX_SYMBOLIC_CHARS:
        return f"longer than {MAX_SYMBOLIC_CHARS} characters"
    for match in _EXPONENT.finditer(expr):
        exponent = _exponent_text(expr, match)
        if "^" in exponent or "!" in exponent:
            return "nested exponent"
        base_is_number = expr[: match.start()].rstrip()[-1:].isdigit()
        limit = MAX_NUMERIC_EXPONENT if base_is_number else MAX_SYMBOLIC_EXPONENT
        if any(int(n) > limit for n in _INTEGER.findall(exponent)):
            return f"exponent above {limit}"
    if any(int(n) > MAX_FACTORIAL for n in _FACTORIAL.findall(expr)):
        return f"factorial above {MAX_FACTORIAL}"
    return None


def _exponent_text(expr: str, match: re.Match[str]) -> str:
    if match.group(1) != "{":
        return match.group(1)
    close = _matching_brace(expr, match.start(1))
    return expr[match.start(1) :] if close is None else expr[match.start(1) : close + 1]


_DROP = re.compile(r"\\left|\\right|\\[,;:! ]|\\displaystyle|\s+|\^\{?\\circ\}?|\\%|%|\\\$")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mathbf|operatorname)\{([^{}]*)\}")
_THOUSANDS = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")


def normalize_answer(text: str) -> str:
    """Canonical spelling of an answer for string comparison (spacing, ``\\dfrac``, units)."""
    text = _TEXT_WRAPPER.sub(r"\1", _unwrap(text))
    text = _DROP.sub("", text)
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return text.rstrip(".").lower()


def _string_equivalent(answer: str, ground_truth: str) -> bool:
    left, right = normalize_answer(answer), normalize_answer(ground_truth)
    if left == right:
        return True
    left_number, right_number = _as_number(left), _as_number(right)
    return left_number is not None and left_number == right_number


def _as_number(text: str) -> Fraction | None:
    """Exact value of a plain number (``12``, ``-0.75``, ``1,000``, ``3/4``), else None."""
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    if len(text) > 50 or not re.fullmatch(r"-?\d+(\.\d+)?(/\d+)?", text):
        return None
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None
