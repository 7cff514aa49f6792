"""The gateway: ``gunicorn -c python:api.gunicorn_conf 'api:create_app()'``."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing the service here would load it into gunicorn's master, before the
    # gevent worker monkey-patches: its module-level locks would then block the whole worker
    from flask import Flask

    from prorl_celery.settings import Settings


def create_app(settings: "Settings | None" = None) -> "Flask":
    """Build the Flask app; configuration comes from ``PRORL_*`` environment variables."""
    from flask import Flask

    from prorl_celery.settings import get_settings

    from . import auth, dashboard, errors, routes, status_views

    from handlers import load_handlers
    from prorl_celery.services import get_services

    settings = settings or get_settings()
    get_services()  # applies PRORL_HANDLERS to the registry
    load_handlers()  # import every task family at start-up, not in the first request
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_request_bytes
    app.json.sort_keys = False
    app.register_blueprint(routes.bp)
    app.register_blueprint(status_views.bp)
    app.register_blueprint(dashboard.bp)
    errors.register(app)
    auth.install(app, settings)
    return app
