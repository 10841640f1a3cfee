"""Images for vision-language actors (Qwen2.5-VL architecture): image tokens, pixel values, 3-D rotary positions.

A turn's observation images enter its prompt as ``<|vision_start|><|image_pad|>*n<|vision_end|>`` per image, where
``n = grid_t * grid_h * grid_w / merge**2`` (the image's patch grid from the model's image processor, ``merge`` its
``merge_size``): the text carries one :data:`IMAGE_PLACEHOLDER` per image and :meth:`ImageInputs.expand` repeats its
pad token ``n`` times after tokenization, so the token ids a trajectory trains on are exactly those the model saw.

In a batch (:class:`~roll.data.batch.Batch`), sample ``i``'s images travel as metadata next to its token ids:
``pixel_values[i]`` (P_i, C*temporal*patch*patch) float32, the patches of all its images in prompt order, and
``image_grid_thw[i]`` (K_i, 3) long, one (t, h, w) row per image (P_i = sum of t*h*w); samples without images hold
empty tensors. :func:`vision_kwargs` concatenates them in row order, which is the order the model's placeholder
scatter consumes them (row-major over ``input_ids``).

Positions: the model's multimodal rotary embedding needs 3-D positions (:func:`rope_positions`, from the model's
own ``get_rope_index``; image tokens at (t, h, w) grid offsets, text after an image continuing past its largest
offset). They are computed over each row's real tokens, so left and right padding give the same positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from roll.data.batch import Batch
from roll.models.loading import is_vision_config, load_tokenizer

VISION_START = "<|vision_start|>"
IMAGE_PAD = "<|image_pad|>"
VISION_END = "<|vision_end|>"
#: The text of one image in a prompt, before :meth:`ImageInputs.expand` (Qwen2.5-VL's chat template renders an
#: image part as exactly this).
IMAGE_PLACEHOLDER = VISION_START + IMAGE_PAD + VISION_END
VISION_TOKENS = (VISION_START, IMAGE_PAD, VISION_END)


#: Qwen2(.5)-VL in transformers >= 4.52 holds its decoder at ``model.language_model`` and its vision tower at
#: ``model.visual``; its checkpoints (``save_pretrained`` writes the older names) and SGLang's loader say ``model.``
#: and ``visual.``.
CHECKPOINT_PREFIXES = (("model.language_model.", "model."), ("model.visual.", "visual."))


def checkpoint_name(name: str) -> str:
    """The checkpoint name of a vision-language model's parameter (:data:`CHECKPOINT_PREFIXES`); others unchanged.

    >>> checkpoint_name("model.language_model.layers.0.mlp.up_proj.weight")
    'model.layers.0.mlp.up_proj.weight'
    >>> checkpoint_name("model.visual.merger.ln_q.weight"), checkpoint_name("lm_head.weight")
    ('visual.merger.ln_q.weight', 'lm_head.weight')
    """
    for module_prefix, checkpoint_prefix in CHECKPOINT_PREFIXES:
        if name.startswith(module_prefix):
            return checkpoint_prefix + name[len(module_prefix) :]
    return name


def collapse_image_pads(ids: Sequence[int], image_pad_id: int) -> list[int]:
    """``ids`` with each run of ``image_pad_id`` cut to one token: the inverse of :meth:`ImageInputs.expand`, the
    prompt an engine that expands image tokens itself (SGLang) is given.

    >>> collapse_image_pads([1, 7, 9, 9, 9, 8, 2], 9)
    [1, 7, 9, 8, 2]
    """
    return [t for k, t in enumerate(ids) if t != image_pad_id or k == 0 or ids[k - 1] != image_pad_id]


def with_image_placeholders(text: str, count: int) -> str:
    """A message's text with ``count`` images before it: one :data:`IMAGE_PLACEHOLDER` each, then ``text``."""
    return IMAGE_PLACEHOLDER * count + text


def is_vision_model(model: Any) -> bool:
    """Whether ``model`` (a DeepSpeed engine, FSDP or peft wrapper, or the HF model) is a vision-language model."""
    module = getattr(model, "module", model)
    return is_vision_config(getattr(module, "config", None))


def vision_tower(model: Any) -> torch.nn.Module:
    """The vision tower of a vision-language model (Qwen2.5-VL: ``model.model.visual``, patch embedding, blocks and
    the merger into the decoder's width).

    Raises:
        ValueError: ``model`` is not a vision-language model.
    """
    module = getattr(model, "module", model)
    tower = getattr(getattr(module, "model", None), "visual", None)
    if tower is None or not is_vision_model(module):
        raise ValueError(
            f"freeze_vision_tower: the model ({type(module).__name__}) has no vision tower; the key applies to "
            "vision-language models (Qwen2.5-VL), set it false"
        )
    return tower


def freeze_vision_tower(model: Any) -> None:
    """Keep the vision tower fixed while training (``model_args.freeze_vision_tower``): no gradients."""
    vision_tower(model).requires_grad_(False)


def copy_image_processor(model_dir: str | None, path: str) -> None:
    """Copy the image processor of ``model_dir`` (``preprocessor_config.json``, if any) into an exported model
    directory ``path``, so that the export serves images as the original does."""
    import shutil
    from pathlib import Path

    file = Path(str(model_dir)) / "preprocessor_config.json"
    if model_dir and file.is_file():
        shutil.copyfile(file, Path(path) / file.name)


def load_image_processor(path: str) -> Any:
    """The image processor saved at ``path`` (``preprocessor_config.json``), without torchvision: the PIL backend.

    Raises:
        ValueError: ``path`` has no image processor (not a vision-language model directory).
    """
    import json
    from pathlib import Path

    file = Path(path) / "preprocessor_config.json"
    if not file.is_file():
        raise ValueError(
            f"the model at {path} has no image processor (preprocessor_config.json): an env returned images, "
            "which need a vision-language model (e.g. Qwen2.5-VL, or tiny_model.vision: true)."
        )
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    kind = json.loads(file.read_text()).get("image_processor_type", "")
    if kind.replace("Pil", "").replace("Fast", "") != "Qwen2VLImageProcessor":
        raise ValueError(
            f"the image processor at {path} is {kind!r}; roll supports Qwen2-VL/Qwen2.5-VL image processors "
            "(image_processor_type Qwen2VLImageProcessor)."
        )
    return Qwen2VLImageProcessorPil.from_pretrained(path)


class ImageInputs:
    """A model's image processor and image token ids: image counts, token expansion and pixel values.

    Args:
        path: the model directory (its ``preprocessor_config.json`` and tokenizer).
        tokenizer: the tokenizer (loaded from ``path`` when None).
    """

    def __init__(self, path: str, tokenizer: Any = None):
        if tokenizer is None:
            tokenizer = load_tokenizer(path)
        self.processor = load_image_processor(path)
        ids = [tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS]
        if any(i is None or i == tokenizer.unk_token_id for i in ids):
            raise ValueError(f"the tokenizer at {path} lacks the image tokens {', '.join(VISION_TOKENS)}")
        self.vision_start_id, self.image_pad_id, self.vision_end_id = ids
        self.merge = int(self.processor.merge_size)

    def encode(self, images: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """Images (H x W x 3 uint8) -> ``pixel_values`` (P, D) float32 and ``image_grid_thw`` (K, 3) long."""
        if not images:
            width = 3 * self.processor.temporal_patch_size * self.processor.patch_size**2
            return torch.zeros(0, width), torch.zeros(0, 3, dtype=torch.long)
        out = self.processor(images=list(images), return_tensors="pt")
        return out["pixel_values"].float(), out["image_grid_thw"].long()

    def grid(self, image: np.ndarray) -> tuple[int, int, int]:
        """The (t, h, w) patch grid of one image (its resized size / the patch size)."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        size = self.processor.size
        h, w = smart_resize(
            image.shape[0],
            image.shape[1],
            factor=self.processor.patch_size * self.merge,
            min_pixels=size["shortest_edge"],
            max_pixels=size["longest_edge"],
        )
        return 1, h // self.processor.patch_size, w // self.processor.patch_size

    def num_tokens(self, image: np.ndarray) -> int:
        """``n = t * h * w / merge**2``: how many ``<|image_pad|>`` tokens stand for ``image``."""
        t, h, w = self.grid(image)
        return t * h * w // self.merge**2

    def expand(self, ids: Sequence[int], images: Sequence[np.ndarray]) -> list[int]:
        """``ids`` with the k-th ``<|image_pad|>`` repeated ``num_tokens(images[k])`` times.

        Raises:
            ValueError: the ids hold another number of image pads than there are images.
        """
        pads = sum(1 for i in ids if i == self.image_pad_id)
        if pads != len(images):
            raise ValueError(f"{pads} image placeholders in the prompt for {len(images)} images")
        counts = iter([self.num_tokens(im) for im in images])
        out: list[int] = []
        for i in ids:
            out += [i] * next(counts) if i == self.image_pad_id else [i]
        return out


def add_pixel_values(batch: Batch, images: Sequence[Sequence[np.ndarray]], inputs: ImageInputs) -> Batch:
    """Set ``pixel_values`` and ``image_grid_thw`` metadata of ``batch`` from each sample's images (in order)."""
    encoded = [inputs.encode(list(sample)) for sample in images]
    batch["pixel_values"] = [pv for pv, _ in encoded]
    batch["image_grid_thw"] = [grid for _, grid in encoded]
    return batch


def vision_kwargs(batch: Batch, device: torch.device | str, dtype: torch.dtype | None = None) -> dict[str, Any]:
    """The model's image arguments for ``batch``: ``pixel_values`` (sum P_i, D) and ``image_grid_thw`` (sum K_i, 3),
    the samples' in row order; empty when no sample has images."""
    if "image_grid_thw" not in batch or not any(len(g) for g in batch["image_grid_thw"]):
        return {}
    pixels = torch.cat([p for p in batch["pixel_values"] if len(p)]).to(device)
    return {
        "pixel_values": pixels if dtype is None else pixels.to(dtype),
        "image_grid_thw": torch.cat([g for g in batch["image_grid_thw"] if len(g)]).to(device),
    }


def rope_positions(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, image_grid_thw: torch.Tensor | None
) -> torch.Tensor:
    """3-D rotary positions (3, B, L) of a batch, from the model's own ``get_rope_index`` over real tokens."""
    module = getattr(model, "module", model)
    inner = getattr(module, "model", module)
    image_token = module.config.image_token_id
    token_types = (input_ids == image_token).int()
    positions, _ = inner.get_rope_index(
        input_ids,
        mm_token_type_ids=token_types,
        image_grid_thw=image_grid_thw,
        attention_mask=attention_mask,
    )
    return positions
