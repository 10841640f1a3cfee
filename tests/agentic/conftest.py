"""Fixtures of the agentic tests: a tokenizer directory (per chat template) and config builders."""

from __future__ import annotations

import pytest

from roll.models.tiny import CHAT_TEMPLATE

#: Strips ``<think>...</think>`` from every assistant message but the last (the reasoning-model style).
THINK_STRIP_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- set content = message['content'] %}"
    "{%- if message['role'] == 'assistant' and not loop.last and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1] %}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _tokenizer_dir(root, template: str) -> str:
    from roll.models.tiny import build_tokenizer

    corpus = ["Answer go.", "pos 12 pos 345", "<answer>go</answer>", "<think>hmm</think>", "You play."] * 4
    tok = build_tokenizer(corpus, vocab_size=300)
    tok.chat_template = template
    tok.save_pretrained(root)
    return str(root)


@pytest.fixture(scope="session")
def qwen_tokenizer_dir(tmp_path_factory) -> str:
    return _tokenizer_dir(tmp_path_factory.mktemp("tok_qwen"), CHAT_TEMPLATE)


@pytest.fixture(scope="session")
def think_strip_tokenizer_dir(tmp_path_factory) -> str:
    return _tokenizer_dir(tmp_path_factory.mktemp("tok_think"), THINK_STRIP_TEMPLATE)


def make_cfg(
    env_config: dict | None = None,
    *,
    group_size: int = 4,
    env_groups: int = 4,
    managers: int = 1,
    max_actions: int = 3,
    max_tokens: int = 8,
    sequence_length: int = 2048,
    batch: int = 16,
    **manager_kw,
):
    """An AgenticConfig with one ``flaky_test`` tag, distributed=local."""
    import tests.agentic.helpers  # noqa: F401  (registers flaky_test)
    from roll.config.agentic import AgenticConfig, CustomEnvConfig, EnvManagerConfig

    cfg = AgenticConfig()
    cfg.distributed = "local"
    cfg.sequence_length = sequence_length
    cfg.rollout_batch_size = batch
    cfg.custom_envs = {
        "Flaky": CustomEnvConfig(
            env_type="flaky_test",
            env_config=dict(env_config or {}),
            max_actions_per_traj=max_actions,
            max_tokens_per_step=max_tokens,
            system_prompt="You play.",
        )
    }
    cfg.train_env_manager = EnvManagerConfig(
        tags=["Flaky"], env_groups=env_groups, group_size=group_size, num_env_managers=managers, **manager_kw
    )
    cfg.actor_infer.generating_args.max_new_tokens = max_tokens
    return cfg
