"""A tiny Qwen2-architecture model and a locally trained tokenizer, saved as a normal Hugging Face directory.

For machines with no model hub: the tokenizer is a byte-level BPE trained on text the built-in envs emit (their
instructions, observations and action formats), so grid symbols are single tokens and action words are one token
each; the model is a randomly initialised ``Qwen2ForCausalLM`` built from a config.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

#: Chat template in the Qwen style: ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
#: Markup the model writes; added whole so each is one token and decodes verbatim.
MARKUP_TOKENS = ["<answer>", "</answer>", "<think>", "</think>", "<tool_call>", "</tool_call>"]
#: Words are one pre-token (BPE can merge them); every other symbol, capital letter and digit stands alone.
PRETOKEN_PATTERN = r" ?[A-Za-z][a-z]+| ?[0-9]|[^\sA-Za-z0-9]|[A-Z]|\s+"


#: The envs whose text the tokenizer is fitted to; user-registered envs do not change the tokenizer.
BUILTIN_ENVS = ("sokoban", "frozen_lake", "countdown", "gsm8k", "tool_use")


def env_corpus(episodes_per_env: int = 40, seed: int = 0) -> list[str]:
    """Text the registered envs produce: instructions, observations and answers, from random play."""
    from roll.envs import make_env
    from roll.envs.base import observation_text

    rng = random.Random(seed)
    lines: list[str] = []
    for name in BUILTIN_ENVS:
        try:
            env = make_env(name)
        except Exception:  # an env that needs arguments or data contributes no text
            continue
        words = list(getattr(env, "valid_actions", ())) or ["42"]
        try:
            for episode in range(episodes_per_env):
                obs, info = env.reset(seed=seed * 100_003 + episode)
                lines += [info["env_instruction"], observation_text(obs)]
                for _ in range(4):
                    action = f"<answer>{rng.choice(words)}</answer>"
                    obs, _, terminated, truncated, _ = env.step(action)
                    lines += [action, observation_text(obs)]
                    if terminated or truncated:
                        break
        except Exception:  # a broken (user) env contributes what it produced before failing
            continue
    lines += [str(n) for n in range(200)]
    return lines


def build_tokenizer(corpus: Iterable[str], vocab_size: int = 1024):
    """Train a byte-level BPE on ``corpus`` and wrap it as a ``PreTrainedTokenizerFast`` with a chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKEN_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS + MARKUP_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(
    path: str | Path,
    *,
    hidden_size: int = 128,
    intermediate_size: int = 512,
    num_hidden_layers: int = 4,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    vocab_size: int = 1024,
    max_position_embeddings: int = 2048,
    initializer_range: float = 0.1,
    seed: int = 0,
    corpus: Iterable[str] | None = None,
) -> Path:
    """Build tokenizer + random Qwen2 model and ``save_pretrained`` both into ``path``; returns ``path``.

    ``roll_tiny.json`` in the directory records the build arguments (and a digest of the corpus), so
    :func:`ensure_tiny_model` can tell a stale build from a current one.
    """
    arguments = {k: v for k, v in locals().items() if k not in ("path", "corpus")}  # the keyword arguments
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    lines = env_corpus() if corpus is None else list(corpus)
    tokenizer = build_tokenizer(lines, vocab_size)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    spec = build_spec(**arguments, corpus=corpus if corpus is None else lines)
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / SPEC_FILE).write_text(json.dumps(spec, sort_keys=True))
    if path.exists():  # called directly on a built directory: build it anew
        shutil.rmtree(path)
    tmp.rename(path)  # atomic: a half-written directory is never mistaken for a model
    return path


#: The file in a built directory that records how it was built.
SPEC_FILE = "roll_tiny.json"


def build_spec(*, corpus: Iterable[str] | None = None, **kwargs) -> dict:
    """The record of a build: its arguments plus a digest of the tokenizer corpus (None: the env corpus)."""
    digest = None
    if corpus is not None:
        digest = hashlib.sha256("\n".join(corpus).encode()).hexdigest()[:16]
    return {**kwargs, "corpus_sha256": digest}


def ensure_tiny_model(path: str | Path, build: Callable[..., Path] | None = None, **kwargs) -> Path:
    """Build the tiny model at ``path`` unless a model is already there; an existing model is never replaced.
    ``build``: the builder (:func:`build_tiny_model`, or :func:`roll.models.tiny_vl.build_tiny_vl_model`).

    When roll built the one there with other arguments (``roll_tiny.json``; e.g. an older default, or a
    ``tiny_model`` change in the config), a warning names the differences: delete the directory to rebuild.
    """
    path = Path(path)
    builder = build or build_tiny_model
    if (path / "config.json").is_file():
        record = path / SPEC_FILE
        if record.is_file():
            corpus = kwargs.get("corpus")
            wanted = json.loads(
                json.dumps(
                    build_spec(**{**_defaults(builder), **kwargs, "corpus": None if corpus is None else list(corpus)})
                )
            )
            have = json.loads(record.read_text())
            diff = sorted(k for k in set(wanted) | set(have) if wanted.get(k) != have.get(k))
            if diff:
                print(
                    f"[roll] warning: the tiny model at {path} was built with other arguments "
                    f"({', '.join(f'{k}: {have.get(k)!r} there, {wanted.get(k)!r} asked' for k in diff)}); "
                    f"using it as it is. Delete the directory to rebuild it.",
                    flush=True,
                )
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    # built beside it and renamed into place: two runs that start together (the README's command twice) each build
    # their own copy, the first rename wins and the other run uses that model (both build the same one)
    scratch = path.parent / f".{path.name}.building-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    builder(scratch, **kwargs)
    try:
        os.rename(scratch, path)
    except OSError:  # another process renamed its copy into place first
        shutil.rmtree(scratch, ignore_errors=True)
        if not (path / "config.json").is_file():
            raise
    return path


def _defaults(builder: Callable[..., Path] | None = None) -> dict:
    """The builder's (``build_tiny_model``'s) keyword defaults (without ``corpus``)."""
    import inspect

    params = inspect.signature(builder or build_tiny_model).parameters
    return {name: p.default for name, p in params.items() if p.kind is p.KEYWORD_ONLY and name != "corpus"}
