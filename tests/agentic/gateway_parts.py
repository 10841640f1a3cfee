"""Test parts for the gateway tests: tool-aware chat templates (append-only, and one that strips earlier
``<think>`` blocks), tokenizer/model directories with them, and generation clients that record what the engine
was given."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

from roll.config.worker import GeneratingArgs
from roll.rollout.client import BatchClient
from roll.strategies.base import GenerationOutput

_HEAD = (
    "{%- set sys = messages[0]['content'] if messages[0]['role'] == 'system' else '' %}"
    "{%- if tools or sys %}{{- '<|im_start|>system\\n' + sys }}"
    "{%- if tools %}{{- '\\n<tools>' }}{%- for t in tools %}{{- '\\n' + (t | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>' }}{%- endif %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'assistant' %}"
)
_TAIL = (
    "{{- '<|im_start|>assistant\\n' + content }}"
    "{%- if m.tool_calls is defined and m.tool_calls %}{%- for c in m.tool_calls %}"
    "{{- '<tool_call>' + ({'name': c.function.name, 'arguments': c.function.arguments} | tojson) + '</tool_call>' }}"
    "{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}"
    "{%- elif m['role'] == 'tool' %}{{- '<|im_start|>user\\n<tool_response>' + m['content'] + "
    "'</tool_response><|im_end|>\\n' }}"
    "{%- elif m['role'] != 'system' %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
#: Qwen2.5-style tool template (tools in the system message, calls as ``<tool_call>`` JSON): append-only.
TOOLS_TEMPLATE = _HEAD + "{%- set content = m['content'] %}" + _TAIL
#: The same, but every assistant message except the last one loses its ``<think>...</think>`` (Qwen3 style).
THINK_STRIP_TOOLS_TEMPLATE = (
    _HEAD + "{%- set content = m['content'] %}"
    "{%- if not loop.last and '</think>' in content %}{%- set content = content.split('</think>')[-1] %}{%- endif %}"
    + _TAIL
)


def model_dir_with_template(source: str, target: Path, template: str) -> str:
    """A copy of the model directory ``source`` whose tokenizer uses ``template``."""
    from roll.models.loading import load_tokenizer

    shutil.copytree(source, target, dirs_exist_ok=True)
    tok = load_tokenizer(str(target))
    tok.chat_template = template
    tok.save_pretrained(str(target))
    return str(target)


class StrategyBatches:
    """A batch generator over an in-process strategy that records every prompt the engine was given."""

    def __init__(self, strategy: Any):
        self.strategy, self.prompts, self.lock = strategy, [], threading.Lock()

    def generate(
        self, prompts: list[list[int]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> list[GenerationOutput]:
        with self.lock:
            self.prompts += [list(p) for p in prompts]
        return self.strategy.generate(prompts, args, max_new_tokens)

    def leave(self) -> None:
        """Nothing to do."""


class ScriptedEngine(BatchClient):
    """Replies ``<think>t{k}</think>`` + an ``add`` tool call + end-of-turn (the k-th reply to a prompt; canonical
    token ids, log-prob -0.5 each; cut at the token budget), recording every prompt it was given."""

    def __init__(self, tokenizer: Any, think: bool = True):
        super().__init__(self)
        self.tokenizer, self.think = tokenizer, think
        self.prompts: list[list[int]] = []

    def reply_text(self, k: int) -> str:
        call = json.dumps({"name": "add", "arguments": {"a": k, "b": 2}})
        return (f"<think>t{k}</think>" if self.think else "") + f"<tool_call>{call}</tool_call>"

    def generate(
        self, prompts: list[list[int]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> list[GenerationOutput]:
        out = []
        for prompt in prompts:
            self.prompts.append(list(prompt))
            k = prompt.count(self.tokenizer.convert_tokens_to_ids("<|im_start|>"))
            ids = self.tokenizer(self.reply_text(k), add_special_tokens=False)["input_ids"]
            ids = ids + [self.tokenizer.eos_token_id]
            budget = max_new_tokens or args.max_new_tokens
            finish = "length" if len(ids) > budget else "stop"
            ids = ids[:budget]
            out.append(GenerationOutput(ids, [-0.5] * len(ids), finish))
        return out

    def leave(self) -> None:
        """Nothing to do."""


class TextEngine(BatchClient):
    """Replies with the next text of ``texts`` (then repeats the last), as canonical token ids ending the turn."""

    def __init__(self, tokenizer: Any, texts: list[str]):
        super().__init__(self)
        self.tokenizer, self.texts, self.calls = tokenizer, texts, 0

    def generate(
        self, prompts: list[list[int]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> list[GenerationOutput]:
        out = []
        for _ in prompts:
            text = self.texts[min(self.calls, len(self.texts) - 1)]
            self.calls += 1
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            out.append(GenerationOutput(ids, [-0.5] * len(ids), "stop"))
        return out

    def leave(self) -> None:
        """Nothing to do."""


def tool_call(name: str, **arguments: Any) -> str:
    """A Hermes-style tool call as the model writes it."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
