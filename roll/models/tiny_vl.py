"""A tiny Qwen2.5-VL-architecture model (hub-free): transformers' ``Qwen2_5_VLForConditionalGeneration`` built from
a ``Qwen2_5_VLConfig`` with a small vision tower, the tiny tokenizer of :mod:`roll.models.tiny` plus the image tokens
(``<|vision_start|>``, ``<|image_pad|>``, ``<|vision_end|>``), and a Qwen2-VL image processor, saved as a normal
Hugging Face directory.

Images are small: the image processor resizes them to sides that are multiples of 28 pixels (patch 14, merge 2),
at most ``max_image_pixels`` pixels (56 x 56 by default: a 4 x 4 patch grid, 4 image tokens per image).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from roll.models.tiny import SPEC_FILE, build_spec, build_tokenizer, ensure_tiny_model, env_corpus
from roll.models.vision import VISION_TOKENS

#: Qwen2.5-VL's video token, added so the config's ``video_token_id`` names a real token (roll sends no video).
VIDEO_PAD = "<|video_pad|>"


def build_tiny_vl_model(
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
    vision_hidden_size: int = 64,
    vision_depth: int = 2,
    vision_heads: int = 2,
    max_image_pixels: int = 56 * 56,
    seed: int = 0,
    corpus: Iterable[str] | None = None,
) -> Path:
    """Build tokenizer + image processor + random Qwen2.5-VL model into ``path``; returns ``path``.

    The text decoder has the sizes of :func:`roll.models.tiny.build_tiny_model`; the vision tower ``vision_depth``
    blocks of width ``vision_hidden_size`` (patch 14, merge 2, its last block full attention), projected to
    ``hidden_size``. ``mrope_section`` splits the rotary half-dimension (head_dim / 2) 1/4 : 3/8 : 3/8 over
    (t, h, w) like Qwen2.5-VL's (16, 24, 24) of 64.
    """
    arguments = {k: v for k, v in locals().items() if k not in ("path", "corpus")}
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    path = Path(path)
    lines = env_corpus() if corpus is None else list(corpus)
    tokenizer, ids = vl_tokenizer(lines, vocab_size)
    half = hidden_size // num_attention_heads // 2
    section = [half // 4, (half - half // 4) // 2, half - half // 4 - (half - half // 4) // 2]
    config = vl_config(
        tokenizer,
        ids,
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": hidden_size,
            "intermediate_size": intermediate_size,
            "num_hidden_layers": num_hidden_layers,
            "num_attention_heads": num_attention_heads,
            "num_key_value_heads": num_key_value_heads,
            "max_position_embeddings": max_position_embeddings,
            "initializer_range": initializer_range,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section},
            "tie_word_embeddings": True,
            "bos_token_id": None,
        },
        vision_config={
            "depth": vision_depth,
            "hidden_size": vision_hidden_size,
            "intermediate_size": 2 * vision_hidden_size,
            "num_heads": vision_heads,
            "out_hidden_size": hidden_size,
            "fullatt_block_indexes": [vision_depth - 1],
            "window_size": 56,
            "initializer_range": initializer_range,
        },
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config)
    spec = build_spec(**arguments, corpus=corpus if corpus is None else lines)
    tmp = path.with_name(path.name + ".tmp")
    save_vl_model(tmp, model, tokenizer, max_image_pixels)
    (tmp / SPEC_FILE).write_text(json.dumps(spec, sort_keys=True))
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
    return path


def vl_tokenizer(lines: list[str], vocab_size: int) -> tuple[Any, dict[str, int]]:
    """The tiny tokenizer fitted on ``lines`` plus Qwen2.5-VL's image and video tokens, and those tokens' ids."""
    tokenizer = build_tokenizer(lines, vocab_size)
    tokenizer.add_tokens([*VISION_TOKENS, VIDEO_PAD], special_tokens=True)
    return tokenizer, {t: tokenizer.convert_tokens_to_ids(t) for t in (*VISION_TOKENS, VIDEO_PAD)}


def vl_config(tokenizer: Any, ids: dict[str, int], text_config: dict, vision_config: dict) -> Any:
    """A tied ``Qwen2_5_VLConfig`` of the given decoder and tower shapes, with ``tokenizer``'s EOS and padding and
    the image and video token ids ``ids`` (:func:`vl_tokenizer`)."""
    from transformers import Qwen2_5_VLConfig

    return Qwen2_5_VLConfig(
        text_config={**text_config, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id},
        vision_config=vision_config,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )


def save_vl_model(path: Path, model: Any, tokenizer: Any, max_image_pixels: int) -> None:
    """Save ``model`` (with a generation config of ``tokenizer``'s EOS and padding), ``tokenizer`` and the image
    processor of :func:`vl_image_processor` as a Hugging Face directory ``path``."""
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    vl_image_processor(max_image_pixels).save_pretrained(path)


def vl_image_processor(max_image_pixels: int) -> Any:
    """A Qwen2-VL image processor (PIL backend) resizing images to between 28*28 and ``max_image_pixels`` pixels
    (sides multiples of patch 14 x merge 2)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(size={"shortest_edge": 28 * 28, "longest_edge": max_image_pixels})


#: ``tiny_model`` keys that only a vision-language build reads.
VISION_KEYS = ("vision_hidden_size", "vision_depth", "vision_heads", "max_image_pixels")


def ensure_tiny_model_of(path: str | Path, vision: bool = False, **kwargs: Any) -> Path:
    """:func:`~roll.models.tiny.ensure_tiny_model` with the ``tiny_model`` block's keys: a Qwen2.5-VL build
    (:func:`build_tiny_vl_model`) for ``vision``, else the text build (the vision keys are not its arguments)."""
    if vision:
        return ensure_tiny_model(path, build=build_tiny_vl_model, **kwargs)
    return ensure_tiny_model(path, **{k: v for k, v in kwargs.items() if k not in VISION_KEYS})
