"""prorl-celery: rollout-as-a-service for RL training of multi-turn LLM agents.

``celery -A prorl_celery worker -Q run`` finds the Celery application here as ``app``.
"""
from .celery_app import app

__all__ = ["app"]
__version__ = "0.1.0"
