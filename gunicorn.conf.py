# gunicorn reads this file when started from the repository root, so the plain
# `gunicorn 'api:create_app()'` gets the gateway's thread settings.
from api.gunicorn_conf import *  # noqa: F401,F403
