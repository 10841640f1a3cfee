"""An OpenAI-compatible gateway that records token ids and log-probs, and the agent runners that play episodes
through it (docs/agents.md)."""
