"""The gateway through its real HTTP server and the ``openai`` client: records vs answers, first-turn prompts vs
the chat template, log-probs vs the trainer's recomputation (next to the native env manager's), keys, refused
requests, tool calls, and template breaks on a template that strips earlier ``<think>`` blocks."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import torch

from roll.agentic.gateway.server import Gateway
from roll.agentic.gateway.tool_parsers import parse_hermes
from roll.config.worker import GeneratingArgs
from roll.models.loading import load_tokenizer
from roll.rollout.client import BatchClient
from tests.agentic.gateway_harness import TOOLS, first_messages, play
from tests.agentic.gateway_parts import (
    THINK_STRIP_TOOLS_TEMPLATE,
    TOOLS_TEMPLATE,
    ScriptedEngine,
    StrategyBatches,
    TextEngine,
    model_dir_with_template,
    tool_call,
)

SAMPLING = GeneratingArgs(max_new_tokens=12, temperature=1.0)


@pytest.fixture(scope="module")
def tools_dir(tiny_model_dir, tmp_path_factory) -> str:
    return model_dir_with_template(tiny_model_dir, tmp_path_factory.mktemp("tools") / "m", TOOLS_TEMPLATE)


@pytest.fixture(scope="module")
def strategy(tools_dir):
    from roll.config.worker import WorkerConfig
    from roll.strategies.base import StrategyContext
    from roll.strategies.registry import build_strategy

    config = WorkerConfig()
    config.model_args.model_name_or_path = tools_dir
    config.strategy_args.strategy_name = "hf_infer"
    s = build_strategy(config, "actor_infer")
    s.initialize(StrategyContext(seed=0))
    return s


def _gateway(model_dir: str, client, sequence_length: int = 1024) -> Gateway:
    gateway = Gateway(load_tokenizer(model_dir), SAMPLING, sequence_length)
    gateway.start()
    gateway.engine.use(client)
    return gateway


def _samples(turns) -> list[list]:
    """Turns split where a turn starts a new sample (the traj-mode layout's rule)."""
    out: list[list] = []
    for turn in turns:
        if not out or turn.starts_sample:
            out.append([])
        out[-1].append(turn)
    return out


def _recomputed_gap(model, turns) -> float:
    """Largest |recorded - recomputed| log-prob over the generated tokens of ``turns`` (fp32 forward per sample)."""
    gap = 0.0
    for sample in _samples(turns):
        ids, positions, recorded = [], [], []
        for turn in sample:
            ids += turn.prompt_ids
            positions += range(len(ids), len(ids) + turn.generated)
            recorded += turn.response_log_probs[: turn.generated]
            ids += turn.response_ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        logp = torch.log_softmax(logits, -1)
        recomputed = torch.stack([logp[p - 1, ids[p]] for p in positions])
        gap = max(gap, (recomputed - torch.tensor(recorded)).abs().max().item())
    return gap


def test_sixteen_concurrent_harnesses_are_recorded_as_generated(tools_dir, strategy):
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(tools_dir)
    engine = StrategyBatches(strategy)
    gateway = _gateway(tools_dir, BatchClient(engine))
    try:
        sessions = [gateway.start_session(12) for _ in range(16)]
        with ThreadPoolExecutor(16) as pool:
            logs = list(pool.map(lambda s: play(gateway.base_url, s[1][1], s[0], turns=3), enumerate(sessions)))
        records = [gateway.end_session(sid) for sid, _ in sessions]
    finally:
        gateway.stop()
    model = AutoModelForCausalLM.from_pretrained(tools_dir, dtype=torch.float32)
    for seed, (log, record) in enumerate(zip(logs, records)):
        assert len(record.turns) == 3 and record.template_breaks == 0
        expected = tok.apply_chat_template(
            first_messages(seed), tools=TOOLS, add_generation_prompt=True, tokenize=True
        )["input_ids"]
        assert record.turns[0].prompt_ids == expected
        context: list[int] = []
        for call, turn in zip(log, record.turns):
            generated = turn.response_ids[: turn.generated]
            assert len(turn.response_log_probs) == turn.generated  # one log-prob per generated id
            text = tok.decode(
                generated[:-1] if generated[-1:] == [tok.eos_token_id] else generated, skip_special_tokens=False
            )
            parsed = parse_hermes(text)
            assert call["reply"].get("content") == parsed.content
            returned = [
                (c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in call["reply"].get("tool_calls", [])
            ]
            assert returned == [(c.name, c.arguments) for c in parsed.calls]
            context += turn.prompt_ids  # the engine saw the recorded history plus the new messages
            assert context in engine.prompts
            context += turn.response_ids
    gateway_gap = max(_recomputed_gap(model, r.turns) for r in records)
    native_gap = _native_gap(tools_dir, strategy, model)
    print(f"max |recorded - recomputed| log-prob: gateway {gateway_gap:.2e}, native env manager {native_gap:.2e}")
    assert gateway_gap < 1e-4 and gateway_gap <= 10 * native_gap + 1e-5


def _native_gap(model_dir: str, strategy, model) -> float:
    """The same measure for roll's own env manager on the same engine."""
    from roll.agentic.env_manager import EnvManager, plan_groups
    from tests.agentic.conftest import make_cfg

    cfg = make_cfg(group_size=2, env_groups=2, max_tokens=12)
    m = cfg.train_env_manager
    manager = EnvManager(m, plan_groups(m, cfg.custom_envs), model_dir, SAMPLING, 1024, 0, "train")
    trajs = manager.rollout(1, BatchClient(StrategyBatches(strategy))).trajectories
    return max(_recomputed_gap(model, t.turns) for t in trajs)


def test_keys_and_refused_requests(tools_dir):
    tok = load_tokenizer(tools_dir)
    gateway = _gateway(tools_dir, ScriptedEngine(tok))
    try:
        sid, key = gateway.start_session(64)
        messages = first_messages(0)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=gateway.base_url, api_key="wrong", max_retries=0).chat.completions.create(
                model="m", messages=messages
            )
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        for bad, named in [
            ({"n": 2}, "n"),
            ({"tool_choice": "required"}, "tool_choice"),
            ({"logit_bias": {"5": 3}}, "logit_bias"),
            ({"max_tokens": 0}, "max_tokens"),
            ({"temperature": "hot"}, "temperature"),
        ]:
            with pytest.raises(openai.BadRequestError, match=named):
                client.chat.completions.create(model="m", messages=messages, **bad)
        assert client.models.list().data[0].id == "roll-policy"
        plain = client.chat.completions.create(model="m", messages=messages).choices[0]
        assert plain.finish_reason == "stop" and "<tool_call>" in plain.message.content  # no tools offered: text
        called = client.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0]
        assert called.finish_reason == "tool_calls" and called.message.tool_calls[0].function.name == "add"
        client.post("/reward", body={"reward": 0.25, "turn": 0}, cast_to=object)
        client.post("/reward", body={"reward": 1.0}, cast_to=object)
        import httpx

        admin = httpx.post(
            gateway.base_url.removesuffix("/v1") + f"/sessions/{sid}/end", headers={"Authorization": f"Bearer {key}"}
        )
        assert admin.status_code == 401  # a session key is not the admin key
        record = gateway.end_session(sid)
        assert [t.reward for t in record.scored_turns()] == [0.25, 1.0]  # turn 0's, then the episode's on the last
        with pytest.raises(openai.AuthenticationError):  # an ended session's key is dead
            client.chat.completions.create(model="m", messages=messages)
        started = httpx.post(
            gateway.base_url.removesuffix("/v1") + "/sessions",
            json={"max_tokens": 8},
            headers={"Authorization": f"Bearer {gateway.admin_key}"},
        ).json()
        assert started["base_url"] == gateway.base_url and started["api_key"] != key
    finally:
        gateway.stop()


def test_tool_calls_round_trip_and_history_extends(tools_dir):
    tok = load_tokenizer(tools_dir)
    engine = ScriptedEngine(tok, think=False)
    gateway = _gateway(tools_dir, engine)
    try:
        sid, key = gateway.start_session(64)
        log = play(gateway.base_url, key, 3, turns=3)
        record = gateway.end_session(sid)
    finally:
        gateway.stop()
    assert [c["finish_reason"] for c in log] == ["tool_calls"] * 3
    assert [json.loads(c["reply"]["tool_calls"][0]["function"]["arguments"]) for c in log] == [
        {"a": k, "b": 2} for k in (3, 5, 7)
    ]  # k = <|im_start|> count of the prompt
    assert record.template_breaks == 0 and not any(t.starts_sample for t in record.turns)
    delta = tok.decode(record.turns[1].prompt_ids, skip_special_tokens=False)
    assert delta == "\n<|im_start|>user\n<tool_response>5</tool_response><|im_end|>\n<|im_start|>assistant\n"
    full = []
    for turn in record.turns:
        full += turn.prompt_ids
        assert engine.prompts.count(full) == 1  # the engine got exactly the recorded ids
        full += turn.response_ids


def test_think_stripping_template_breaks_into_samples_the_engine_saw(tools_dir, tmp_path):
    strip_dir = model_dir_with_template(tools_dir, tmp_path / "strip", THINK_STRIP_TOOLS_TEMPLATE)
    tok = load_tokenizer(strip_dir)
    engine = ScriptedEngine(tok, think=True)
    gateway = _gateway(strip_dir, engine)
    try:
        sessions = [gateway.start_session(64) for _ in range(4)]
        with ThreadPoolExecutor(4) as pool:
            logs = list(pool.map(lambda s: play(gateway.base_url, s[1][1], s[0], turns=4), enumerate(sessions)))
        records = [gateway.end_session(sid) for sid, _ in sessions]
    finally:
        gateway.stop()
    assert all(len(log) == 4 for log in logs)
    for record in records:
        samples = _samples(record.turns)
        # every later turn re-renders the earlier replies without their <think>: each is a break
        assert record.template_breaks == 3 == sum(t.starts_sample for t in record.turns)
        assert len(samples) == record.template_breaks + 1
        for sample in samples:
            ids = []
            for turn in sample:
                ids += turn.prompt_ids
                assert ids in engine.prompts  # every trained prompt is one the engine was given
                ids += turn.response_ids
        assert (
            "<think>"
            not in tok.decode(samples[-1][0].prompt_ids[:-20], skip_special_tokens=False).split(
                "<|im_start|>assistant"
            )[1]
        )  # the new sample's prompt is the template's rendering, think stripped


def test_length_cut_and_stop_strings(tools_dir):
    tok = load_tokenizer(tools_dir)
    gateway = _gateway(tools_dir, ScriptedEngine(tok, think=True))
    try:
        sid, key = gateway.start_session(64)
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        cut = client.chat.completions.create(model="m", messages=first_messages(1), max_tokens=3)
        stopped = client.chat.completions.create(model="m", messages=first_messages(1), stop=["</think>"])
        record = gateway.end_session(sid)
    finally:
        gateway.stop()
    assert cut.choices[0].finish_reason == "length"
    assert stopped.choices[0].finish_reason == "stop" and stopped.choices[0].message.content == "<think>t3"
    first, second = record.turns
    assert first.appended_eos and first.generated == 3 and len(first.response_log_probs) == 3
    assert tok.decode(second.response_ids[: second.generated], skip_special_tokens=False) == "<think>t3</think>"
    assert second.appended_eos and second.response_ids[-1] == tok.eos_token_id
    assert second.starts_sample  # a different conversation than the first reply continues


def test_async_client_logprobs_and_openai_error_format(tools_dir):
    """The async client gets the same service as the sync one; ``logprobs`` returns the recorded log-probs; what is
    not served (the Responses API, an unknown route, a forced tool call, a JSON-schema response format) is a
    4xx in OpenAI's error format that the client parses, naming the key."""
    import asyncio

    import httpx

    tok = load_tokenizer(tools_dir)
    gateway = _gateway(tools_dir, ScriptedEngine(tok, think=False))
    try:
        sid, key = gateway.start_session(64)

        async def ask() -> object:
            async with openai.AsyncOpenAI(base_url=gateway.base_url, api_key=key, max_retries=0) as client:
                return await client.chat.completions.create(
                    model="m", messages=first_messages(2), tools=TOOLS, logprobs=True, parallel_tool_calls=False
                )

        reply = asyncio.run(ask()).choices[0]
        record = gateway.session(sid).turns[0]
        assert reply.finish_reason == "tool_calls" and reply.message.tool_calls[0].function.name == "add"
        assert (
            [c.logprob for c in reply.logprobs.content]
            == record.response_log_probs
            == [-0.5] * len(record.response_ids)
        )
        assert "".join(c.token for c in reply.logprobs.content) == tok.decode(record.response_ids)
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        with pytest.raises(openai.NotFoundError, match="Responses and legacy Completions APIs are not served"):
            client.responses.create(model="m", input="hi")
        with pytest.raises(openai.BadRequestError) as forced:
            client.chat.completions.create(model="m", messages=first_messages(2), tools=TOOLS, tool_choice="required")
        assert forced.value.code == "unsupported_parameter" and forced.value.param == "tool_choice"
        assert "tool_choice='auto'" in forced.value.message  # the fix, in the message
        with pytest.raises(openai.BadRequestError, match="response_format"):
            client.chat.completions.create(
                model="m", messages=first_messages(2), response_format={"type": "json_object"}
            )
        lost = httpx.get(gateway.base_url + "/nothing-here", headers={"Authorization": f"Bearer {key}"})
        assert lost.status_code == 404 and lost.json()["error"]["code"] == "not_found"
        assert len(gateway.session(sid).turns) == 1  # refused requests are not turns
    finally:
        gateway.stop()


def test_streaming_sends_what_would_have_been_returned(tools_dir):
    """``stream=True`` (sync and async clients, with usage): the chunks put together are the non-streamed reply
    (content, tool calls, finish reason, log-probs), sampled and recorded the same way."""
    import asyncio

    tok = load_tokenizer(tools_dir)
    gateway = _gateway(tools_dir, ScriptedEngine(tok, think=True))
    try:
        sessions = [gateway.start_session(64) for _ in range(3)]
        clients = [openai.OpenAI(base_url=gateway.base_url, api_key=k, max_retries=0) for _, k in sessions]
        ask = {"model": "m", "messages": first_messages(4), "tools": TOOLS, "logprobs": True}
        plain = clients[0].chat.completions.create(**ask).choices[0]
        streamed = list(clients[1].chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))

        async def stream_async() -> list:
            async with openai.AsyncOpenAI(base_url=gateway.base_url, api_key=sessions[2][1], max_retries=0) as c:
                return [chunk async for chunk in await c.chat.completions.create(**ask, stream=True)]

        for chunks, usage in ((streamed, True), (asyncio.run(stream_async()), False)):
            assert all(c.object == "chat.completion.chunk" for c in chunks) and chunks[0].choices[0].delta.role
            deltas = [c.choices[0] for c in chunks if c.choices]
            content = "".join(d.delta.content or "" for d in deltas)
            calls = [t for d in deltas for t in d.delta.tool_calls or []]
            assert content == plain.message.content == "<think>t3</think>"  # the tool call is not content
            assert [(t.index, t.function.name, t.function.arguments) for t in calls] == [
                (0, "add", plain.message.tool_calls[0].function.arguments)
            ]
            assert calls[0].id.startswith("call_s-") and deltas[-1].finish_reason == "tool_calls"
            assert [x.logprob for d in deltas if d.logprobs for x in d.logprobs.content] == [
                x.logprob for x in plain.logprobs.content
            ]
            assert (chunks[-1].usage is not None) == usage and (not usage or chunks[-1].usage.completion_tokens > 0)
        records = [gateway.end_session(sid).turns for sid, _ in sessions]
        assert all(len(turns) == 1 for turns in records)
        assert records[0][0].response_ids == records[1][0].response_ids == records[2][0].response_ids
        assert records[0][0].response_log_probs == records[1][0].response_log_probs
    finally:
        gateway.stop()


def test_the_call_past_the_turn_limit_is_refused(tools_dir):
    tok = load_tokenizer(tools_dir)
    gateway = _gateway(tools_dir, ScriptedEngine(tok, think=False))
    try:
        sid, key = gateway.start_session(64, max_turns=2)
        log = play(gateway.base_url, key, 1, turns=2)
        with pytest.raises(openai.BadRequestError) as refused:
            play(gateway.base_url, key, 1, turns=1)
        record = gateway.end_session(sid)
    finally:
        gateway.stop()
    assert len(log) == 2 and len(record.turns) == 2 and record.turn_limit_hit
    assert refused.value.code == "max_turns_exceeded" and "turn limit reached" in refused.value.message


def test_tool_calls_that_do_not_parse_are_counted(tools_dir):
    """A call cut by the token budget (never closed), one with broken JSON and one of a function the request did not
    offer are errors of their turns (invalid actions); the text goes back as the model wrote it."""
    tok = load_tokenizer(tools_dir)
    replies = ['<tool_call>{"name": "add", "argu', "<tool_call>{add(1, 2)}</tool_call>", tool_call("divide", a=1)]
    gateway = _gateway(tools_dir, TextEngine(tok, replies + [tool_call("add", a=1, b=2)]))
    try:
        sid, key = gateway.start_session(64)
        log = play(gateway.base_url, key, 0, turns=4)
        record = gateway.end_session(sid)
    finally:
        gateway.stop()
    assert [t.action_is_valid for t in record.turns] == [False, False, False, True] and record.parse_errors == 3
    assert log[0]["reply"]["content"] == replies[0] and "tool_calls" not in log[0]["reply"]
    assert log[2]["reply"]["tool_calls"][0]["function"]["name"] == "divide"  # returned, counted as invalid
