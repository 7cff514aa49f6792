"""Dev tooling: the tiny models and tokenizers the tests and the demo build, the local
cluster behind ``prorl up``, the demo, vLLM on CPU, and the reference LLM server.
"""
