"""The ``math`` task: rule-graded math problems, answered in one or more model turns.

Registered as ``math = handlers.math:MathHandler`` (entry point group ``prorl.handlers``).
"""
from handlers.math.grading import extract_boxed, is_equivalent, normalize_answer
from handlers.math.handler import FOLLOW_UP, MathHandler
from handlers.math.instances import MathInstance, normalize_instance, validate_instance
from handlers.math.samples import load_samples, sample_names

__all__ = [
    "FOLLOW_UP",
    "MathHandler",
    "MathInstance",
    "extract_boxed",
    "is_equivalent",
    "load_samples",
    "normalize_answer",
    "normalize_instance",
    "sample_names",
    "validate_instance",
]
