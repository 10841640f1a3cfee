"""roll.agentic"""
