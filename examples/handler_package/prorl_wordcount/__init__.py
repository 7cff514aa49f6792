"""An example task family for prorl-celery, installed as its own distribution (see README.md)."""
