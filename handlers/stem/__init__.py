"""The ``stem`` task: science questions answered with search over a shipped corpus and python.

Registered as ``stem = handlers.stem:StemHandler`` (entry point group ``prorl.handlers``).
The corpus and questions in ``data/`` are rendered by ``python -m handlers.stem.build_data``
from the facts in ``facts.py``.
"""
from handlers.stem.grading import Grade, extract_answer, grade, normalize_text, parse_number
from handlers.stem.handler import CORPUS_MOUNT, DATA_DIR, StemHandler
from handlers.stem.instances import StemInstance, normalize_instance, validate_instance

__all__ = [
    "CORPUS_MOUNT",
    "DATA_DIR",
    "Grade",
    "StemHandler",
    "StemInstance",
    "extract_answer",
    "grade",
    "normalize_instance",
    "normalize_text",
    "parse_number",
    "validate_instance",
]
