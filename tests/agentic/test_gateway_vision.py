"""A vision-language actor behind the gateway (the tiny Qwen2.5-VL-architecture model, ``hf_infer`` on CPU), through
the real HTTP server and the ``openai`` client: the images a harness sends as ``image_url`` parts are what the engine
generates from and what the turns record, their image tokens are expanded in the recorded prompt ids, the recorded
log-probs are the model's recomputation with those pixels, and another image behind the same text starts a new
sample."""

from __future__ import annotations

import numpy as np
import openai
import pytest
import torch

from roll.agentic.gateway.images import image_url_part
from roll.agentic.gateway.server import Gateway
from roll.config.worker import GeneratingArgs, WorkerConfig
from roll.data.layout import rollout_log_probs, trajectories_to_batch
from roll.data.trajectory import Trajectory, prompt_images
from roll.models.loading import load_tokenizer
from roll.models.vision import ImageInputs, add_pixel_values
from roll.rollout.client import BatchClient
from roll.strategies.base import StrategyContext
from roll.strategies.registry import build_strategy

SAMPLING = GeneratingArgs(max_new_tokens=5, temperature=1.0, top_p=1.0, top_k=0, do_sample=True)


def frame(seed: int, size: int = 24) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)


def user(text: str, *images: np.ndarray) -> dict:
    parts = [image_url_part(im) for im in images]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


class Recorder:
    """A generation backend over an in-process ``hf_infer`` strategy that keeps the images of every prompt."""

    def __init__(self, strategy):
        self.strategy, self.images = strategy, []

    def generate(self, prompts, args, max_new_tokens=None):
        self.images += [list(prompt_images(p)) for p in prompts]
        return self.strategy.generate(prompts, args, max_new_tokens)

    def leave(self) -> None:
        """Nothing in flight."""


@pytest.fixture(scope="module")
def infer(tiny_vl_model_dir):
    cfg = WorkerConfig()
    cfg.model_args.model_name_or_path = tiny_vl_model_dir
    cfg.strategy_args.strategy_name = "hf_infer"
    strategy = build_strategy(cfg, "actor_infer")
    strategy.initialize(StrategyContext(seed=0))
    return strategy


def test_images_sent_are_seen_recorded_and_scored(tiny_vl_model_dir, infer):
    tok = load_tokenizer(tiny_vl_model_dir)
    inputs = ImageInputs(tiny_vl_model_dir, tok)
    recorder = Recorder(infer)
    gateway = Gateway(tok, SAMPLING, 1024, image_inputs=inputs)
    gateway.start()
    gateway.engine.use(BatchClient(recorder))
    a, b, c = frame(0), frame(1, 32), frame(2)
    try:
        sid, key = gateway.start_session(5)
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        messages = [{"role": "system", "content": "You are a Sokoban player."}, user("Move.", a)]
        reply = client.chat.completions.create(model="m", messages=messages).choices[0].message.content
        messages += [{"role": "assistant", "content": reply}, user("Move again.", b)]
        reply2 = client.chat.completions.create(model="m", messages=messages).choices[0].message.content
        turns = list(gateway.session(sid).turns)
        # the same text with another first image: not the history the engine saw, so a new sample with all images
        changed = [messages[0], user("Move.", c), *messages[2:]]
        client.chat.completions.create(model="m", messages=changed)
        broken = gateway.session(sid).turns[2]
        decoded = len(gateway.session(sid).decoded)
        with pytest.raises(openai.BadRequestError, match="0 images"):  # placeholder text without an image
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "<|vision_start|><|image_pad|><|vision_end|>"}]
            )
    finally:
        gateway.stop()

    first, second = turns
    assert len(first.images) == 1 and np.array_equal(first.images[0], a)
    assert len(second.images) == 1 and np.array_equal(second.images[0], b) and not second.starts_sample
    pad = inputs.image_pad_id
    assert first.prompt_ids.count(pad) == inputs.num_tokens(a) and second.prompt_ids.count(pad) == inputs.num_tokens(b)
    assert inputs.num_tokens(b) != inputs.num_tokens(a) or b.shape != a.shape  # two image sizes
    # the engine generated from the sample's images: turn 1 from a, turn 2 from a and b, the break from c and b
    seen = recorder.images
    assert [len(s) for s in seen] == [1, 2, 2]
    assert np.array_equal(seen[1][0], a) and np.array_equal(seen[1][1], b)
    assert broken.starts_sample and [x.shape for x in broken.images] == [c.shape, b.shape]
    assert np.array_equal(broken.images[0], c) and np.array_equal(seen[2][0], c)
    assert reply and reply2 is not None
    # each image was decoded once in the session, though every request repeats the conversation
    assert decoded == 3 and broken.images[1] is second.images[0]

    # recorded log-probs = the model's recomputation from the recorded ids and images (hf_infer's scoring pass)
    traj = Trajectory("t", 0, 0, "Frames", 0, turns=turns)
    batch = trajectories_to_batch([traj], tok.pad_token_id)
    add_pixel_values(batch, batch["images"], inputs)
    engine, mask = rollout_log_probs([traj], batch["input_ids"].shape[1])
    assert mask.sum() >= 2
    scored = infer.compute_log_probs(batch)["log_probs"]
    torch.testing.assert_close(scored[mask.bool()], engine[mask.bool()], atol=2e-5, rtol=1e-5)
