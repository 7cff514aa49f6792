"""prorl-celery: rollout-as-a-service for RL training of multi-turn LLM agents.

``celery -A prorl_celery worker -Q run`` finds the Celery application here as ``app``. It is
built on first access, so a trainer importing the client (``prorl_celery.trainer.client``, ``dapo``,
``weights``) loads neither Celery nor the service's settings.
"""
from __future__ import annotations

from typing import Any

__all__ = ["app"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "app":
        from prorl_celery.celery_app import app

        return app
    raise AttributeError(f"module 'prorl_celery' has no attribute {name!r}")
