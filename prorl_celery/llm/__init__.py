"""LLM layer: backend pool, token-in/token-out clients, sessions and the fidelity check."""
