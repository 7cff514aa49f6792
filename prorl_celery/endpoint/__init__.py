"""The per-job endpoint: an agent program's LLM, token-exact underneath (DESIGN decision 19).

- :mod:`.app`: the HTTP app, its routes and the endpoint's core (admit a call, converse);
- :mod:`.history`: matching a re-sent history against the turns served (the exact ids);
- :mod:`.samples`: which training sample each call belongs to;
- :mod:`.anthropic_messages`, :mod:`.responses_api`: Anthropic Messages and OpenAI Responses, translated to
  the chat dialect.
"""
