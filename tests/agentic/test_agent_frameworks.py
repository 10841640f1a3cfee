"""The framework harnesses of examples/agents against a gateway whose engine replies from a script: each framework
gets the gateway's answers in the form it expects (tool calls included), the harness computes its reward from what
the agent did (the right answer earns 1), and mini-swe-agent's commands run in roll's sandbox (no network, no host
files) on a repository that persists from command to command. The end-to-end training runs are in
tests/pipelines/test_agent_gateway_e2e.py."""

from __future__ import annotations

import json

import pytest

from roll.agentic.gateway.runners import AgentTask
from roll.agentic.gateway.server import Gateway
from roll.config.agentic import CustomEnvConfig
from roll.config.worker import GeneratingArgs
from roll.models.loading import load_tokenizer
from tests.agentic.gateway_parts import TextEngine
from tests.agentic.gateway_parts import tool_call as call


@pytest.fixture
def scripted(tiny_model_dir):
    """``scripted(texts, max_turns) -> (task, session record getter)``; the gateway is stopped afterwards."""
    gateways = []

    def make(texts: list[str], max_turns: int = 4, seed: int = 0):
        tok = load_tokenizer(tiny_model_dir)
        gateway = Gateway(tok, GeneratingArgs(max_new_tokens=64), 4096)
        gateway.start()
        gateway.engine.use(TextEngine(tok, texts))
        gateways.append(gateway)
        sid, key = gateway.start_session(64, max_turns=max_turns)  # as the env manager starts it
        env = CustomEnvConfig(max_actions_per_traj=max_turns)
        task = AgentTask(gateway.base_url, key, "roll-policy", seed, "T", env, 0.0, "answer", 0, 0, "train")
        return task, lambda: gateway.session(sid)

    yield make
    for gateway in gateways:
        gateway.stop()


def test_openai_agents_sdk_calls_its_function_tool_and_is_scored(scripted):
    from examples.agents.openai_agents_shop import PRICES, shop

    task, record = scripted([call("price", item="apple"), "That is 6 euros."], seed=0)  # seed 0: 2 apples
    assert sorted(PRICES)[0] == "apple"
    result = shop(task)
    assert result.reward == 1.0 and result.success
    turns = record().turns
    assert len(turns) == 2 and turns[0].parsed_action == json.dumps([["price", {"item": "apple"}]])
    assert "3" in turns[1].observation  # the tool's answer went back to the model
    wrong, _ = scripted(["It costs 9."], seed=0)
    assert shop(wrong).reward == pytest.approx(0.5 * (1 - 3 / 6))  # shaped by closeness to 6


def test_langgraph_runs_its_tool_node_and_is_scored(scripted):
    from examples.agents.langgraph_calculator import calculate

    task, record = scripted([call("multiply", a=2, b=3), call("add", a=6, b=1), "The answer is 7."])
    assert calculate(task).reward == 1.0  # seed 0: 2 * 3 + 1
    assert [t.observation for t in record().turns[1:]] == ["6", "7"]  # the tool node's results
    looping, record = scripted([call("add", a=1, b=1)], max_turns=3)  # never answers: stopped at its turn budget
    assert calculate(looping).reward == 0.0 and len(record().turns) == 3


def test_mini_swe_agent_fixes_the_bug_in_the_sandbox(scripted):
    from examples.agents.mini_swe_fix import fix

    commands = [
        "cat calc.py && python test_calc.py",
        "sed -i '0,/return a - b/s//return a + b/' calc.py && python test_calc.py",
        "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
    ]
    task, record = scripted([call("bash", command=c) for c in commands], seed=0)  # seed 0: add is broken
    result = fix(task)
    assert result.reward == 1.0 and result.success and result.metrics["commands"] == 3
    observations = [t.observation for t in record().turns]
    assert "AssertionError: add(2, 3) should be 5" in observations[1] and "all tests pass" in observations[2]


def test_the_sandboxed_shell_keeps_the_repository_and_nothing_else():
    pytest.importorskip("minisweagent")
    from examples.agents.sandbox_shell import SandboxShell

    shell = SandboxShell({"a.txt": "one\n"}, timeout=10)
    assert shell.execute({"command": "echo two >> a.txt && mkdir d && echo x > d/b.txt"})["returncode"] == 0
    assert shell.files == {"a.txt": "one\ntwo\n", "d/b.txt": "x\n"}  # the repository, as the command left it
    seen = shell.execute({"command": "cat a.txt d/b.txt; ls ~ /root 2>&1; echo $HOME"})
    assert seen["output"].startswith("one\ntwo\nx\n") and "Permission denied" in seen["output"]
    offline = shell.execute(
        {"command": "python -c \"import urllib.request as u; u.urlopen('http://1.1.1.1', timeout=3)\""}
    )
    assert offline["returncode"] != 0  # no network inside
    assert shell.execute({"command": "exit 3"})["returncode"] == 3


def test_smolagents_defaults_are_refused_with_the_fix_in_the_message(scripted):
    """ToolCallingAgent sends tool_choice="required" unless told otherwise: the gateway refuses the forced call, and
    the whole error, as the failure line shows it, names the refusal and the one-line fix."""
    from smolagents import OpenAIModel, ToolCallingAgent

    from examples.agents.smolagents_letters import letters
    from roll.agentic.failures import describe

    task, record = scripted(["unused"])
    model = OpenAIModel(task.model, api_base=task.base_url, api_key=task.api_key, client_kwargs={"max_retries": 0})
    agent = ToolCallingAgent(tools=[letters], model=model, max_steps=2, verbosity_level=0)
    with pytest.raises(Exception) as info:
        agent.run("How many letters does kiwi have?")
    line = describe(info.value)
    assert line.startswith("AgentGenerationError: Error while generating output: Error code: 400 - "), line
    assert "tool_choice='required' is not supported by roll's gateway" in line and " <- BadRequestError" in line
    assert "smolagents: OpenAIModel(..., tool_choice='auto')" in line and record().turns == []


@pytest.mark.parametrize("stream", [False, True])
def test_smolagents_counts_with_its_tool_streamed_or_not(scripted, stream):
    from examples.agents.smolagents_letters import count

    task, record = scripted(
        [call("letters", word="apple"), call("letters", word="apple"), call("final_answer", answer="10")]
    )
    result = count(task, stream=stream)  # seed 0: apple and apple
    assert result.reward == 1.0 and result.success
    turns = record().turns
    assert [json.loads(t.parsed_action)[0][0] for t in turns] == ["letters", "letters", "final_answer"]
    assert "5" in turns[1].observation and not record().turn_limit_hit


def test_smolagents_extra_final_call_meets_the_turn_limit(scripted):
    """smolagents asks for a final answer after max_steps: one call past the turn budget, refused by the gateway;
    smolagents takes the refusal as its answer, so the harness returns and the episode counts as cut by the limit."""
    from examples.agents.smolagents_letters import count

    task, record = scripted(["I think so.", "Not sure."], max_turns=2)
    result = count(task)
    assert result.reward == 0.0 and not result.success  # no number in the refusal
    assert len(record().turns) == 2 and record().turn_limit_hit
