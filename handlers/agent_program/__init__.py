"""The ``agent`` task: run an agent program someone already has (mini-swe-agent, a plain
``openai`` SDK script, ...) inside the job's sandbox against the job's token-exact
OpenAI-compatible endpoint, and score what it did.

Registered as ``agent = handlers.agent_program:AgentProgramHandler`` (entry point group
``prorl.handlers``).
"""
from handlers.agent_program.handler import AgentProgramHandler
from handlers.agent_program.instances import KNOWN_AGENTS, AgentInstance, normalize_instance

__all__ = ["AgentProgramHandler", "AgentInstance", "KNOWN_AGENTS", "normalize_instance"]
