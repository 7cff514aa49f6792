"""Flask's JSON through msgspec: request bodies and answers, at a fraction of the stdlib's CPU.

A ``/process`` answer (the whole trajectory) took 3-4 % of a gateway worker's CPU to encode with
the stdlib ``json`` Flask uses by default. msgspec (a dependency already: the job store decodes
records with it) encodes the same dicts several times faster and keeps their key order (as the
default provider does here with ``sort_keys = False``). What msgspec does not know is handed to
Flask's own fallback (``__html__``; dates, UUIDs, dataclasses and decimals it encodes itself);
calls with stdlib options (``indent``, debug mode's pretty printing) go to the stdlib as before.
"""
from __future__ import annotations

from typing import Any, cast

import msgspec
from flask import Response
from flask.json.provider import DefaultJSONProvider


class MsgspecJSONProvider(DefaultJSONProvider):
    sort_keys = False  # answers keep the order the views build

    def __init__(self, app: Any) -> None:
        super().__init__(app)
        self._encoder = msgspec.json.Encoder(enc_hook=self.default)

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        if kwargs:
            return super().dumps(obj, **kwargs)
        return self._encoder.encode(obj).decode()

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        if kwargs:
            return super().loads(s, **kwargs)
        return msgspec.json.decode(s)  # a DecodeError is a ValueError, as werkzeug expects

    def response(self, *args: Any, **kwargs: Any) -> Response:
        if (self.compact is None and self._app.debug) or self.compact is False:
            return cast(Response, super().response(*args, **kwargs))
        body = self._encoder.encode(self._prepare_response_obj(args, kwargs)) + b"\n"
        response_class: Any = self._app.response_class  # the Flask app's: it takes bytes
        return cast(Response, response_class(body, mimetype=self.mimetype))
