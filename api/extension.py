"""The app's ``Services``: made by ``create_app`` from its settings, read by views per request.

As in the Flask tutorial's ``db.init_app(app)``, the state lives on the app
(``app.extensions["prorl"]``), not in a module global, so two apps in one process (tests with
their own settings) never share a Redis client, a store or a broker.
"""
from __future__ import annotations

from flask import Flask, current_app

from prorl_celery.services import Services

KEY = "prorl"


def init_app(app: Flask, services: Services) -> None:
    app.extensions[KEY] = services


def app_services() -> Services:
    """The services of the app handling the current request."""
    return current_app.extensions[KEY]
