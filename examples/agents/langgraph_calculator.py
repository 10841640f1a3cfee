"""A calculator agent built with LangGraph (``langgraph`` + ``langchain-openai``), trained through roll's gateway.

The graph is LangGraph's tool loop: a model node (``ChatOpenAI`` with the tools bound) and a ``ToolNode`` with
``add`` and ``multiply``, joined by ``tools_condition``. The harness configures LangChain and nothing else:
``ChatOpenAI`` pointed at the gateway (base URL, the episode's key, the model name), LangSmith tracing off (it would
send traces to LangSmith's servers when a user's environment turns it on), and a recursion limit from the task's turn
budget. docs/agents_langgraph.md walks through it; its config is ``examples/config/langgraph_tiny.yaml``.
"""

from __future__ import annotations

import os
import re

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from roll.agentic.gateway.runners import AgentResult, AgentTask

os.environ["LANGSMITH_TRACING"] = "false"  # no trace upload, whatever the environment says
os.environ["LANGCHAIN_TRACING_V2"] = "false"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


TOOLS = [add, multiply]


def calculate(task: AgentTask, shaping: float = 0.5) -> AgentResult:
    """One episode: "what is a * b + c?". Reward: 1 when the last message holds the right result, else up to
    ``shaping`` the closer its first number is (so that a model that cannot compute yet still learns)."""
    a, b, c = 2 + task.seed % 7, 3 + task.seed % 5, 1 + task.seed % 9  # the episodes of a group share the seed
    expected = a * b + c
    llm = ChatOpenAI(model=task.model, base_url=task.base_url, api_key=task.api_key, max_retries=0)
    model = llm.bind_tools(TOOLS)

    def think(state: MessagesState) -> dict:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", think)
    graph.add_node("tools", ToolNode(TOOLS, handle_tool_errors=True))  # a bad call is answered, not raised
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    question = {"messages": [("user", f"What is {a} * {b} + {c}? Use the tools, then answer with the number.")]}
    try:  # each model call and each tool call is a graph step: task.max_turns model calls fit in 2 * max_turns
        messages = graph.compile().invoke(question, {"recursion_limit": 2 * task.max_turns})["messages"]
        answer = str(messages[-1].content)
    except GraphRecursionError:  # out of turns without an answer
        answer = ""
    numbers = [int(n) for n in re.findall(r"\d+", answer)]
    if numbers and numbers[0] == expected:
        return AgentResult(1.0, success=True)
    closeness = max(0.0, 1.0 - abs(numbers[0] - expected) / expected) if numbers else 0.0
    return AgentResult(shaping * closeness, success=False, metrics={"answered": float(bool(numbers))})
