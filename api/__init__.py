"""The gateway: ``gunicorn -c python:api.gunicorn_conf 'api:create_app()'``."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing the service here would load it into gunicorn's master, before the
    # gevent worker monkey-patches: its module-level locks would then block the whole worker
    from flask import Flask

    from prorl_celery.core.settings import Settings


def create_app(settings: Settings | None = None) -> Flask:
    """Build the Flask app from ``settings``; without them, from the ``PRORL_*`` environment
    variables, read once here.

    Everything the views use comes from these settings: auth, body limit, and the app's
    ``Services`` (Redis, job store, backend pool, broker), kept in ``app.extensions``. The
    handler registry is process-wide: ``settings.handlers`` is applied to it here.
    """
    from flask import Flask

    from handlers import load_handlers, registry
    from prorl_celery.core.settings import get_settings
    from prorl_celery.services import Services

    from . import auth, dashboard, errors, extension, gevent_redis, routes, status_views
    from .json_provider import MsgspecJSONProvider

    gevent_redis.install()  # under gunicorn's gevent worker only

    settings = settings or get_settings()
    registry.configure(settings.handlers, **settings.handler_options())
    load_handlers()  # import every task family at start-up, not in the first request
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_request_bytes
    app.json = MsgspecJSONProvider(app)
    services = Services(settings, redis_retry_s=settings.gateway_redis_retry_s)
    services.celery  # noqa: B018 - built at start-up, not in the first submit
    extension.init_app(app, services)
    app.register_blueprint(routes.bp)
    app.register_blueprint(status_views.bp)
    app.register_blueprint(dashboard.bp)
    errors.register(app)
    auth.install(app, settings)
    return app
