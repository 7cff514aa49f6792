"""The ``swe`` task: fix an issue in a repository, graded by its hidden tests (SWE-bench format).

Registered as ``swe = handlers.swe:SweHandler`` (entry point group ``prorl.handlers``).
"""
from handlers.swe.handler import SweHandler
from handlers.swe.instances import SweInstance, load_instances, normalize_instance, validate_instance

__all__ = ["SweHandler", "SweInstance", "load_instances", "normalize_instance", "validate_instance"]
