"""Images in gateway requests: OpenAI ``image_url`` content parts (data URLs) decoded to the exact pixels sent, and
every refusal (a text-only actor, a URL that is not a data URL, bytes that are no image, a part of another type)
answered with a 400 that names the part, through the real HTTP server and the ``openai`` client."""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
from PIL import Image

from roll.agentic.gateway.images import MAX_IMAGE_PIXELS, decode_data_url, digest, message_images
from roll.agentic.gateway.server import Gateway
from roll.agentic.gateway.session import GatewayError
from roll.config.worker import GeneratingArgs
from roll.models.loading import load_tokenizer
from tests.agentic.gateway_parts import TextEngine


def data_url(image: np.ndarray | Image.Image, fmt: str = "PNG") -> str:
    """``image`` as a base64 data URL in ``fmt``."""
    pil = image if isinstance(image, Image.Image) else Image.fromarray(image)
    buffer = io.BytesIO()
    pil.save(buffer, format=fmt)
    return f"data:image/{fmt.lower()};base64,{base64.b64encode(buffer.getvalue()).decode()}"


def pixels(height: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def test_data_urls_decode_to_the_pixels_sent() -> None:
    frame = pixels(30, 40, 0)
    assert np.array_equal(decode_data_url(data_url(frame), "p"), frame)  # PNG: lossless, H x W x 3 uint8
    rgba = Image.fromarray(np.dstack([frame, np.full((30, 40), 7, np.uint8)]), "RGBA")
    assert np.array_equal(decode_data_url(data_url(rgba), "p"), frame)  # alpha dropped
    gray = decode_data_url(data_url(Image.new("L", (5, 3), 200)), "p")
    assert gray.shape == (3, 5, 3) and gray.dtype == np.uint8 and (gray == 200).all()
    jpeg = decode_data_url(data_url(frame, "JPEG"), "p")
    assert jpeg.shape == (30, 40, 3) and np.abs(jpeg.astype(int) - frame).mean() < 80  # lossy, but that image
    assert digest([frame]) != digest([pixels(30, 40, 1)]) and digest([]) is None


@pytest.mark.parametrize(
    "url, code, words",
    [
        ("https://example.com/cat.png", "invalid_image_url", "accepts images as data URLs only"),
        ("data:image/png,rawbytes", "invalid_image_url", "is not base64"),
        (
            "data:image/png;base64," + base64.b64encode(b"not an image at all").decode(),
            "invalid_image",
            "does not decode",
        ),
        ("data:image/png;base64,%%%%", "invalid_image", "does not decode"),
        (None, "invalid_image_url", "accepts images as data URLs only"),
    ],
)
def test_bad_image_urls_are_refused_naming_the_part(url, code, words) -> None:
    with pytest.raises(GatewayError) as err:
        decode_data_url(url, "messages[1].content[2]")
    assert err.value.status == 400 and err.value.code == code and words in err.value.message
    assert err.value.message.startswith("messages[1].content[2]") and err.value.param.startswith(
        "messages[1].content[2]"
    )


def test_an_image_over_the_pixel_bound_is_refused() -> None:
    side = int(MAX_IMAGE_PIXELS**0.5) + 1
    with pytest.raises(GatewayError, match=f"the image is {side} x {side} pixels; at most {MAX_IMAGE_PIXELS}"):
        decode_data_url(data_url(Image.new("RGB", (side, side))), "messages[0].content[0]")


def test_parts_are_checked_per_message() -> None:
    a, b = pixels(8, 8, 0), pixels(4, 6, 1)
    messages = [
        {"role": "system", "content": "Look."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Two: "}, image_part(data_url(a)), image_part(data_url(b))],
        },
    ]
    got = message_images(messages, actor=None)  # a vision-language actor
    assert [len(m) for m in got] == [0, 2] and np.array_equal(got[1][0], a) and np.array_equal(got[1][1], b)
    with pytest.raises(GatewayError, match=r"messages\[1\].content\[1\]: actor /m/tiny is text-only; image_url parts"):
        message_images(messages, actor="/m/tiny")
    with pytest.raises(GatewayError, match=r"messages\[0\].content\[0\]: an assistant message cannot hold images"):
        message_images([{"role": "assistant", "content": [image_part(data_url(a))]}], actor=None)
    with pytest.raises(GatewayError, match=r"messages\[0\].content\[0\]: content part type 'input_audio' is not"):
        message_images([{"role": "user", "content": [{"type": "input_audio"}]}], actor="/m/tiny")


def test_a_text_only_actor_refuses_image_parts_over_http(tiny_model_dir) -> None:
    tok = load_tokenizer(tiny_model_dir)
    gateway = Gateway(tok, GeneratingArgs(max_new_tokens=8), 1024)
    gateway.start()
    gateway.engine.use(TextEngine(tok, ["<answer>Up</answer>"]))
    try:
        sid, key = gateway.start_session(8)
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        parts = [{"type": "text", "text": "Where to? "}, image_part(data_url(pixels(8, 8, 0)))]
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": parts}])
        body = err.value.body
        assert body["code"] == "images_not_supported" and body["param"] == "messages[0].content[1]"
        assert body["message"] == (
            f"messages[0].content[1]: actor {tiny_model_dir} is text-only; image_url parts need a vision-language actor"
        )
        with pytest.raises(openai.BadRequestError, match="content part type 'file' is not served"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": [{"type": "file"}]}])
        # text parts alone are text, as before
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": parts[:1]}])
        assert reply.choices[0].message.content == "<answer>Up</answer>"
        (turn,) = gateway.session(sid).turns
        assert turn.images == [] and "Where to? " in tok.decode(turn.prompt_ids)
    finally:
        gateway.stop()


def test_the_env_runner_sends_an_env_frame_as_an_image_part() -> None:
    """EnvRunner's message for an env that shows images (Sokoban with render_mode=rgb_array): the frame as a PNG
    data URL part, then the text; the gateway decodes exactly the env's pixels from it. A text env stays text."""
    from roll.agentic.gateway.runners import observation_content
    from roll.envs import make_env

    obs, _ = make_env("sokoban", {"render_mode": "rgb_array", "max_steps": 3}).reset(seed=5)
    content = observation_content("the room: ...", obs)
    assert [p["type"] for p in content] == ["image_url", "text"] and content[1]["text"] == "the room: ..."
    (images,) = message_images([{"role": "user", "content": content}], actor=None)
    assert len(images) == 1 and np.array_equal(images[0], obs.images[0])
    text_obs, _ = make_env("sokoban", {"max_steps": 3}).reset(seed=5)
    assert observation_content("the room: ...", text_obs) == "the room: ..."
