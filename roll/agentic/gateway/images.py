"""Images in chat requests: OpenAI content parts, checked and decoded to the pixels a vision-language actor sees.

A message's ``content`` may be a string or a list of parts: ``{"type": "text", "text": ...}`` and
``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`` (``detail`` is accepted and has no
effect: the actor's image processor sizes every image). Only data URLs are served (PNG, JPEG, GIF, WebP, BMP: what
Pillow reads; the first frame of an animation): the gateway fetches nothing, and the pixels it decodes are what the
model sees and what the sample records (``Turn.images``). Each image becomes an H x W x 3 uint8 RGB array.

Answered with a 400 naming the part (``param``: ``messages[i].content[j]``): a part of another type, an image in an
assistant message, an image URL that is not a data URL, data that does not decode as an image or has more than
:data:`MAX_IMAGE_PIXELS` pixels, and any image part when the actor is text-only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
from typing import Any

import numpy as np

from roll.agentic.gateway.session import GatewayError

#: Most pixels of one decoded image (larger ones are refused before they are decoded).
MAX_IMAGE_PIXELS = 4096 * 4096
#: ``data:<media type>[;parameters];base64,<data>``
DATA_URL = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?);base64,(?P<data>.*)", re.S)
PART_TYPES = ("text", "image_url")


def image_url_part(image: np.ndarray) -> dict[str, Any]:
    """An H x W x 3 uint8 image as an OpenAI ``image_url`` content part, a PNG data URL: what a harness sends and
    :func:`decode_data_url` reads back."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
    return {"type": "image_url", "image_url": {"url": url}}


def decode_data_url(url: Any, where: str) -> np.ndarray:
    """The pixels of a ``data:image/...;base64,...`` URL as an H x W x 3 uint8 RGB array.

    Raises:
        GatewayError: 400 naming ``where`` (the part) when ``url`` is not a base64 data URL or not an image.
    """
    from PIL import Image, UnidentifiedImageError

    if not isinstance(url, str) or not url.startswith("data:"):
        shown = url if not isinstance(url, str) or len(url) <= 60 else url[:60] + "..."
        raise GatewayError(
            400,
            f"{where}.image_url.url={shown!r}: roll's gateway accepts images as data URLs only "
            f"(data:image/png;base64,<data>); it fetches nothing, so that the pixels recorded are the ones sent",
            "invalid_image_url",
            f"{where}.image_url.url",
        )
    match = DATA_URL.fullmatch(url)
    if match is None:
        raise GatewayError(
            400,
            f"{where}.image_url.url is a data URL that is not base64 (expected data:image/png;base64,<data>)",
            "invalid_image_url",
            f"{where}.image_url.url",
        )
    try:
        raw = base64.b64decode(match["data"], validate=False)
        with Image.open(io.BytesIO(raw)) as image:
            if image.width * image.height > MAX_IMAGE_PIXELS:
                raise GatewayError(
                    400,
                    f"{where}: the image is {image.width} x {image.height} pixels; at most {MAX_IMAGE_PIXELS} "
                    f"are accepted (downscale it before sending)",
                    "invalid_image",
                    where,
                )
            return np.asarray(image.convert("RGB"), dtype=np.uint8).copy()
    except (binascii.Error, UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as err:
        kind = match["type"] or "no media type"
        raise GatewayError(
            400,
            f"{where}: the data URL ({kind}, {len(match['data'])} base64 characters) does not decode as an image "
            f"({type(err).__name__}: {err}); send PNG, JPEG, GIF, WebP or BMP bytes, base64-encoded",
            "invalid_image",
            where,
        ) from None


def message_images(
    messages: list[dict[str, Any]], actor: str | None, cache: dict[str, np.ndarray] | None = None
) -> list[list[np.ndarray]]:
    """Each message's images, in part order, after checking its content parts (module docstring).

    Args:
        messages: the request's messages (OpenAI form).
        actor: the actor's name when it is text-only (any image part is then refused), None for a vision-language
            actor.
        cache: images decoded before, by the SHA-1 of their URL (a session's: every request repeats the
            conversation, so each image is decoded once per episode); filled here.
    """
    out: list[list[np.ndarray]] = []
    for i, message in enumerate(messages):
        images: list[np.ndarray] = []
        content = message.get("content")
        for j, part in enumerate(content if isinstance(content, list) else []):
            where = f"messages[{i}].content[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in PART_TYPES:
                raise GatewayError(
                    400,
                    f"{where}: content part type {kind!r} is not served; roll's gateway takes {list(PART_TYPES)} "
                    f"parts ({{'type': 'text', 'text': ...}}, {{'type': 'image_url', 'image_url': {{'url': "
                    f"'data:image/png;base64,...'}}}})",
                    "unsupported_content_part",
                    where,
                )
            if kind == "text":
                continue
            if actor is not None:
                raise GatewayError(
                    400,
                    f"{where}: actor {actor} is text-only; image_url parts need a vision-language actor",
                    "images_not_supported",
                    where,
                )
            if message.get("role") == "assistant":
                raise GatewayError(400, f"{where}: an assistant message cannot hold images", "invalid_image", where)
            image_url = part.get("image_url")
            url = image_url.get("url") if isinstance(image_url, dict) else image_url
            images.append(_decoded(url, where, cache))
        out.append(images)
    return out


def _decoded(url: Any, where: str, cache: dict[str, np.ndarray] | None) -> np.ndarray:
    """:func:`decode_data_url`, once per URL while ``cache`` lives."""
    if cache is None or not isinstance(url, str):
        return decode_data_url(url, where)
    key = hashlib.sha1(url.encode()).hexdigest()
    if key not in cache:
        cache[key] = decode_data_url(url, where)
    return cache[key]


def digest(images: list[np.ndarray]) -> str | None:
    """A short digest of images' sizes and pixels (None for none): two messages with the same text and other
    images are different conversation steps."""
    if not images:
        return None
    h = hashlib.sha256()
    for image in images:
        h.update(repr(image.shape).encode())
        h.update(np.ascontiguousarray(image).tobytes())
    return h.hexdigest()[:16]
