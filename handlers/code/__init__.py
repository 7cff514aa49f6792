"""The ``code`` task: a coding agent writes a solution; hidden tests judge it in a fresh sandbox.

Registered as ``code = handlers.code:CodeHandler`` (entry point group ``prorl.handlers``).
"""
from handlers.code.grading import summarize, tokens_match, values_match, verdict
from handlers.code.handler import CodeHandler, extract_code, judge_tests, run_judge
from handlers.code.instances import CodeInstance, normalize_instance, validate_instance
from handlers.code.samples import load_problems

__all__ = [
    "CodeHandler",
    "CodeInstance",
    "extract_code",
    "judge_tests",
    "load_problems",
    "normalize_instance",
    "run_judge",
    "summarize",
    "tokens_match",
    "validate_instance",
    "values_match",
    "verdict",
]
