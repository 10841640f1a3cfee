"""Vision-language actors on CPU: a tiny Qwen2.5-VL-architecture model (transformers' class, a Qwen2-VL image
processor, image tokens) sees Sokoban frames through the env manager, ``hf_infer`` and the training backends.

What is checked: image token counts and expansion (hand-computed), a rollout's engine log-probs equal the trainer's
(``deepspeed_train``) on the rollout batch, the pixels reach the log-probs and the gradient reaches the vision tower
(none with ``freeze_vision_tower``), and one training step with images in ``deepspeed_train`` and ``fsdp2_train``;
a batch without images trains a VL model too, and ``hf_infer``'s text prompts after image prompts generate as before.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from roll.agentic.env_manager import EnvManager, plan_groups
from roll.config.agentic import AgenticConfig, CustomEnvConfig, EnvManagerConfig
from roll.config.worker import GeneratingArgs, WorkerConfig
from roll.data.layout import loss_mask, rollout_log_probs, trajectories_to_batch
from roll.data.trajectory import ImagePrompt
from roll.models.vision import IMAGE_PLACEHOLDER, ImageInputs, add_pixel_values, vision_tower
from roll.ppo.loss_fns import SFT_LOSS
from roll.rollout.client import BatchClient
from roll.strategies.base import StrategyContext
from roll.strategies.registry import build_strategy

pytestmark = pytest.mark.usefixtures("dist_env")  # one-rank torch.distributed environment (conftest)

SAMPLING = GeneratingArgs(max_new_tokens=5, temperature=1.0, top_p=1.0, top_k=0, do_sample=True)


def _worker(model_dir: str, name: str, role: str, options: dict | None = None, **model_args: Any):
    cfg = WorkerConfig()
    cfg.model_args.model_name_or_path = model_dir
    cfg.model_args.disable_gradient_checkpointing = True
    for key, value in model_args.items():
        setattr(cfg.model_args, key, value)
    cfg.strategy_args.strategy_name = name
    cfg.strategy_args.strategy_config = dict(options or {})
    cfg.training_args.per_device_train_batch_size = 2
    cfg.training_args.gradient_accumulation_steps = 2
    cfg.training_args.learning_rate = 1e-2
    strategy = build_strategy(cfg, role)
    strategy.initialize(StrategyContext(seed=0, max_grad_norm=0.0, total_steps=10))
    return strategy


class _Engine:
    """A :class:`~roll.rollout.client.GenerationBackend` over an ``hf_infer`` strategy in this process."""

    def __init__(self, strategy: Any):
        self.strategy = strategy

    def generate(self, prompts, args, max_new_tokens=None):
        return self.strategy.generate(prompts, args, max_new_tokens)

    def leave(self) -> None:
        """Nothing in flight."""


def _rollout(model_dir: str, infer: Any, max_actions: int = 2, generator: Any = None, frames: bool = True):
    """Two Sokoban groups of two envs seen as 48x48 frames (tile 8; as text only without ``frames``),
    ``max_actions`` turns each, through ``infer``."""
    cfg = AgenticConfig()
    shown = {"render_mode": "rgb_array", "tile_pixels": 8} if frames else {}
    cfg.custom_envs = {
        "SokobanVL": CustomEnvConfig(
            env_type="sokoban",
            env_config={"dim_room": [6, 6], **shown, "max_steps": 10},
            max_actions_per_traj=max_actions,
            max_tokens_per_step=5,
        )
    }
    cfg.train_env_manager = EnvManagerConfig(tags=["SokobanVL"], env_groups=2, group_size=2)
    manager = EnvManager(
        cfg.train_env_manager,
        plan_groups(cfg.train_env_manager, cfg.custom_envs),
        model_dir,
        SAMPLING,
        1024,
        seed=3,
        phase="train",
        raise_env_errors=True,
    )
    client = generator(manager.tokenizer, "<answer>Wait</answer>") if generator else BatchClient(_Engine(infer))
    result = manager.rollout(1, client)
    trajs = result.trajectories
    batch = trajectories_to_batch(trajs, manager.tokenizer.pad_token_id)
    if frames:
        add_pixel_values(batch, batch["images"], ImageInputs(model_dir))
    return manager, trajs, batch, result


@pytest.fixture(scope="module")
def infer(tiny_vl_model_dir):
    return _worker(tiny_vl_model_dir, "hf_infer", "actor_infer")


@pytest.fixture(scope="module")
def rollout(tiny_vl_model_dir, infer):
    return _rollout(tiny_vl_model_dir, infer)


@pytest.fixture(scope="module")
def trainer(tiny_vl_model_dir):
    return _worker(tiny_vl_model_dir, "deepspeed_train", "actor_train", {"zero_stage": 0})


def test_image_tokens_are_counted_and_expanded(tiny_vl_model_dir):
    images = ImageInputs(tiny_vl_model_dir)
    # sides round to multiples of patch 14 x merge 2 = 28, within [28*28, 56*56] pixels:
    # 48x48 -> 56x56 -> grid (1, 4, 4) -> 16 patches / merge^2 = 4 tokens; 24x24 -> 28x28 -> (1, 2, 2) -> 1 token
    small, wide = np.zeros((48, 48, 3), np.uint8), np.zeros((30, 60, 3), np.uint8)
    assert images.grid(small) == (1, 4, 4) and images.num_tokens(small) == 4
    assert images.grid(np.zeros((24, 24, 3), np.uint8)) == (1, 2, 2)
    pixels, grid = images.encode([small, wide])
    assert grid.tolist() == [[1, 4, 4], [1, *images.grid(wide)[1:]]]
    assert pixels.shape == (int(grid.prod(-1).sum()), 3 * 2 * 14 * 14)
    pad = images.image_pad_id
    ids = images.expand([7, images.vision_start_id, pad, images.vision_end_id, 8, pad], [small, wide])
    assert ids == [7, images.vision_start_id, *[pad] * 4, images.vision_end_id, 8, *[pad] * images.num_tokens(wide)]
    with pytest.raises(ValueError, match="1 image placeholders in the prompt for 2 images"):
        images.expand([pad], [small, small])


def test_checkpoint_names_are_the_names_save_pretrained_writes(tiny_vl_model_dir):
    """What SGLang receives (``checkpoint_name`` of each parameter) is what a saved checkpoint holds; collapsing the
    pads undoes ``expand``."""
    from safetensors import safe_open
    from transformers import Qwen2_5_VLForConditionalGeneration

    from roll.models.vision import checkpoint_name, collapse_image_pads

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(tiny_vl_model_dir)
    names = {checkpoint_name(n) for n, _ in model.named_parameters()}
    with safe_open(f"{tiny_vl_model_dir}/model.safetensors", "pt") as saved:
        assert names == set(saved.keys()) and any(n.startswith("visual.") for n in names)
    assert not any(n.startswith("model.visual") for n in names)
    images = ImageInputs(tiny_vl_model_dir)
    pad, frame = images.image_pad_id, np.zeros((48, 48, 3), np.uint8)
    ids = [7, images.vision_start_id, pad, images.vision_end_id, 8, pad, 9]
    assert collapse_image_pads(images.expand(ids, [frame, frame]), pad) == ids


def test_turns_carry_frames_and_image_tokens_are_prompt_tokens(rollout):
    manager, trajs, batch, _ = rollout
    images = manager.image_inputs()
    for i, traj in enumerate(trajs):
        assert traj.failure is None and len(traj.turns) == 2
        for turn in traj.turns:  # each turn's observation frame: a 48x48 RGB uint8 array, in its prompt
            assert [im.shape for im in turn.images] == [(48, 48, 3)] and turn.images[0].dtype == np.uint8
            assert turn.prompt_ids.count(images.image_pad_id) == 4
            assert turn.prompt_ids.count(images.vision_start_id) == 1
        ids, mask = batch["input_ids"][i], batch["response_mask"][i]
        pads = ids == images.image_pad_id
        assert int(pads.sum()) == 8 and int(mask[pads].sum()) == 0  # image tokens are never trained on
        assert batch["image_grid_thw"][i].tolist() == [[1, 4, 4], [1, 4, 4]]
        assert batch["pixel_values"][i].shape[0] == 32
        assert not np.array_equal(traj.turns[0].images[0], trajs[(i + 2) % 4].turns[0].images[0])  # other group


def test_image_prompts_follow_the_chat_template(tiny_vl_model_dir):
    """Canonical replies (a scripted engine): the template of the whole conversation, its image placeholders
    expanded, gives exactly the trajectory's ids; every request carried the sample's images so far."""
    from tests.agentic.helpers import ScriptedGenerator

    seen: list[int] = []

    class Recording(ScriptedGenerator):
        def generate(self, prompts, args, max_new_tokens=None):
            seen.extend(len(p.images) for p in prompts)
            return super().generate(prompts, args, max_new_tokens)

    tokenizer = ImageInputs(tiny_vl_model_dir)
    manager, trajs, _, result = _rollout(tiny_vl_model_dir, None, generator=Recording)
    assert result.conformance_checked == 4 and result.conformance_mismatches == 0
    assert all(t.template_conforms for t in trajs)
    assert seen == [1] * 4 + [2] * 4  # turn 2 of a sample: the first turn's frame and the new one
    assert manager.image_inputs().image_pad_id == tokenizer.image_pad_id


def test_trainer_log_probs_of_a_rollout_equal_the_engines(rollout, trainer, infer):
    _, trajs, batch, _ = rollout
    engine, engine_mask = rollout_log_probs(trajs, batch["input_ids"].shape[1])
    assert engine_mask.sum() >= 8
    got = trainer.compute_log_probs(batch)["log_probs"]
    torch.testing.assert_close(got[engine_mask.bool()], engine[engine_mask.bool()], atol=2e-5, rtol=1e-5)
    scored = infer.compute_log_probs(batch)["log_probs"]  # hf_infer's own scoring pass agrees too
    torch.testing.assert_close(scored[engine_mask.bool()], engine[engine_mask.bool()], atol=2e-5, rtol=1e-5)


def test_changing_pixels_changes_the_log_probs(rollout, trainer):
    _, _, batch, _ = rollout
    mask = loss_mask(batch["response_mask"]).bool()
    before = trainer.compute_log_probs(batch)["log_probs"]
    flipped = batch.select(range(len(batch)))
    flipped["pixel_values"] = [-p for p in batch["pixel_values"]]
    after = trainer.compute_log_probs(flipped)["log_probs"]
    assert (after - before)[mask].abs().max() > 1e-3


def _vision_params(strategy) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in vision_tower(strategy.engine).named_parameters()}


@pytest.mark.parametrize("frozen", [False, True])
def test_gradient_reaches_the_vision_tower_unless_frozen(tiny_vl_model_dir, rollout, frozen):
    _, _, batch, _ = rollout
    strategy = _worker(
        tiny_vl_model_dir, "deepspeed_train", "actor_train", {"zero_stage": 0}, freeze_vision_tower=frozen
    )
    before = _vision_params(strategy)
    decoder_before = strategy.engine.module.lm_head.weight.detach().clone()
    metrics = strategy.train_step(batch, SFT_LOSS)
    after = _vision_params(strategy)
    assert math.isfinite(metrics["actor/grad_norm"]) and metrics["actor/grad_norm"] > 0
    assert not torch.equal(decoder_before, strategy.engine.module.lm_head.weight)
    moved = [n for n in before if not torch.equal(before[n], after[n])]
    if frozen:
        assert moved == [] and all(not p.requires_grad for p in vision_tower(strategy.engine).parameters())
    else:  # the patch embedding (first layer of the tower) and the merger (its last) both learn
        assert "patch_embed.proj.weight" in moved and any(n.startswith("merger.") for n in moved)


@pytest.mark.parametrize("name, options", [("deepspeed_train", {"zero_stage": 2}), ("fsdp2_train", {})])
def test_one_training_step_with_images(tiny_vl_model_dir, rollout, name, options, tmp_path):
    _, _, batch, _ = rollout
    strategy = _worker(tiny_vl_model_dir, name, "actor_train", options)
    want = strategy.compute_log_probs(batch)["log_probs"]
    metrics = strategy.train_step(batch, SFT_LOSS, return_log_probs=True)
    assert math.isfinite(metrics["actor/grad_norm"]) and metrics["actor/grad_norm"] > 0
    losses = [v for k, v in metrics.items() if "loss" in k and isinstance(v, float)]
    assert losses and all(math.isfinite(v) for v in losses)
    mask = loss_mask(batch["response_mask"]).bool()
    # the first step's forward ran on the weights before the update: its log-probs are the scoring pass's
    torch.testing.assert_close(metrics["log_probs"][mask], want[mask], atol=2e-5, rtol=1e-5)
    strategy.save_pretrained(str(tmp_path / "final"))  # the export serves images: model, tokenizer, image processor
    exported = ImageInputs(str(tmp_path / "final"))
    assert exported.image_pad_id == ImageInputs(tiny_vl_model_dir).image_pad_id
    from roll.models.loading import load_causal_lm

    assert type(load_causal_lm(str(tmp_path / "final"))).__name__ == "Qwen2_5_VLForConditionalGeneration"


@pytest.mark.parametrize("name, options", [("deepspeed_train", {"zero_stage": 2}), ("fsdp2_train", {})])
def test_a_batch_without_images_trains_a_vision_language_model(tiny_vl_model_dir, infer, name, options):
    """A VL actor on a text env (or a ROLL VL config whose env draws no frames): the vision tower takes no part in
    the forward. FSDP2 keeps the tower's blocks as units of their own; one never gathered must not fail backward."""
    _, _, batch, _ = _rollout(tiny_vl_model_dir, infer, frames=False)
    assert "pixel_values" not in batch and "images" not in batch
    strategy = _worker(tiny_vl_model_dir, name, "actor_train", options)
    metrics = strategy.train_step(batch, SFT_LOSS)
    assert math.isfinite(metrics["actor/grad_norm"]) and metrics["actor/grad_norm"] > 0


@pytest.mark.parametrize("copies", [3, 2])
def test_text_prompts_after_image_prompts_generate_as_before(tiny_vl_model_dir, copies):
    """A VL engine's text prompts that start from shared keys (a group's copies) after a batch with images (of
    another size, or the same): transformers keeps that batch's 3-D rotary offsets, which must not reach the text
    prompts (a shape error, or shifted positions)."""
    engine = _worker(tiny_vl_model_dir, "hf_infer", "actor_infer")
    images = ImageInputs(tiny_vl_model_dir)
    tok = engine.tokenizer
    text = tok.encode("<|im_start|>user\nMove.<|im_end|>\n<|im_start|>assistant\n")
    framed = images.expand(tok.encode(IMAGE_PLACEHOLDER) + text, [np.full((48, 48, 3), 90, np.uint8)])
    greedy = GeneratingArgs(max_new_tokens=4, do_sample=False)
    before = engine.generate([text] * copies, greedy)
    engine.generate([ImagePrompt(framed, [np.full((48, 48, 3), 90, np.uint8)])] * 2, greedy)
    after = engine.generate([text] * copies, greedy)
    assert [o.token_ids for o in after] == [o.token_ids for o in before]
    for a, b in zip(after, before):
        torch.testing.assert_close(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-5, rtol=1e-5)


def test_a_text_model_refuses_images(tiny_model_dir):
    strategy = _worker(tiny_model_dir, "hf_infer", "actor_infer")
    prompt = ImagePrompt([1, 2, 3], [np.zeros((24, 24, 3), np.uint8)])
    with pytest.raises(ValueError, match="not a vision-language model"):
        strategy.generate([prompt], SAMPLING)
    assert IMAGE_PLACEHOLDER == "<|vision_start|><|image_pad|><|vision_end|>"


def test_megatron_refuses_a_vision_language_model_in_one_line(tiny_vl_model_dir):
    from roll.config.errors import ConfigError
    from roll.config.megatron import MegatronOptions, check_megatron_options, read_hf_config

    key = "actor_train.strategy_args.strategy_config"
    with pytest.raises(ConfigError, match="vision-language model.*deepspeed_train or fsdp2_train") as info:
        check_megatron_options(MegatronOptions(), key, 1, "bf16", read_hf_config(tiny_vl_model_dir))
    assert "\n" not in str(info.value) and "model_name_or_path" in str(info.value)


def test_freeze_vision_tower_on_a_text_model_is_an_error(tiny_model_dir):
    with pytest.raises(ValueError, match="freeze_vision_tower: the model .* has no vision tower"):
        _worker(tiny_model_dir, "deepspeed_train", "actor_train", {"zero_stage": 0}, freeze_vision_tower=True)


def test_a_reply_with_an_image_token_ends_its_episode_as_failed(tiny_vl_model_dir):
    """A reply holding <|image_pad|> would be counted as an image the sample lacks (the forward fails on it): the
    episode ends as failed, named and counted, the env is not stepped with it, and nothing of it is trained."""
    from tests.agentic.helpers import ScriptedGenerator

    class ImageTokenReply(ScriptedGenerator):
        def __init__(self, tokenizer: Any, _text: str):
            super().__init__(tokenizer, "<answer>Up</answer><|image_pad|>")

    cfg = AgenticConfig()
    cfg.custom_envs = {
        "SokobanVL": CustomEnvConfig(
            env_type="sokoban",
            env_config={"dim_room": [6, 6], "render_mode": "rgb_array", "tile_pixels": 8, "max_steps": 10},
            max_actions_per_traj=2,
            max_tokens_per_step=8,
        )
    }
    cfg.train_env_manager = EnvManagerConfig(tags=["SokobanVL"], env_groups=1, group_size=2)
    plan = plan_groups(cfg.train_env_manager, cfg.custom_envs)
    manager = EnvManager(cfg.train_env_manager, plan, tiny_vl_model_dir, SAMPLING, 1024, seed=3, phase="train")
    trajs = manager.rollout(1, ImageTokenReply(manager.tokenizer, "")).trajectories
    assert len(trajs) == 2
    for traj in trajs:
        assert traj.failure_type == "ImageTokenInReply" and "<|image_pad|>" in traj.failure
        assert len(traj.turns) == 1 and traj.turns[0].parsed_action is None  # ended before the env saw the reply
