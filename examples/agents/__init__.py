"""Agent harnesses written against the OpenAI API, trained through roll's gateway (docs/agents.md)."""
