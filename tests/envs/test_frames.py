"""Envs that see: ``render_mode="rgb_array"`` observations carry frames (Sokoban, FrozenLake, a user's env)."""

import numpy as np
import pytest

from roll.envs import make_env
from roll.envs.base import Observation, observation_images, observation_text
from roll.envs.frames import draw_grid
from roll.envs.frozen_lake import FrozenLakeTextEnv
from roll.envs.sokoban import SokobanEnv
from roll.envs.sokoban.env import TILE_COLORS

ROOM = """
######
#P_X_#
#____#
#__O_#
#____#
######
"""


def _cell(image: np.ndarray, r: int, c: int, tile: int) -> np.ndarray:
    return image[r * tile : (r + 1) * tile, c * tile : (c + 1) * tile]


def test_sokoban_frame_shows_the_room_and_changes_after_a_move():
    env = SokobanEnv(render_mode="rgb_array", tile_pixels=4)
    obs, _ = env.reset(seed=0, options={"room": ROOM})
    assert isinstance(obs, Observation) and obs.text == ROOM.strip() and len(obs.images) == 1
    frame = obs.images[0]
    assert frame.dtype == np.uint8 and frame.shape == (24, 24, 3)
    # hand-computed: the player's cell (1, 1) is floor with a 2x2 player square in its middle (inset 1 of 4)
    player = _cell(frame, 1, 1, 4)
    assert tuple(player[0, 0]) == TILE_COLORS["_"] and tuple(player[1, 1]) == TILE_COLORS["P"]
    assert (player[1:3, 1:3] == TILE_COLORS["P"]).all() and tuple(player[3, 3]) == TILE_COLORS["_"]
    assert (_cell(frame, 0, 0, 4) == TILE_COLORS["#"]).all()
    assert (_cell(frame, 3, 3, 4) == TILE_COLORS["O"]).all()
    obs2, *_ = env.step("<answer>Right</answer>")  # the player walks to (1, 2)
    changed = np.argwhere((obs2.images[0] != frame).any(-1))
    assert {(int(r) // 4, int(c) // 4) for r, c in changed} == {(1, 1), (1, 2)}
    assert tuple(_cell(obs2.images[0], 1, 2, 4)[1, 1]) == TILE_COLORS["P"]
    assert np.array_equal(env.render(), obs2.images[0])


def test_sokoban_frames_are_deterministic_and_follow_the_text():
    a, b = SokobanEnv(render_mode="rgb_array", tile_pixels=3), SokobanEnv(render_mode="rgb_array", tile_pixels=3)
    for seed in range(5):
        (oa, _), (ob, _) = a.reset(seed=seed), b.reset(seed=seed)
        assert oa.text == ob.text and np.array_equal(oa.images[0], ob.images[0])
        for word in ("Up", "Left", "Down"):
            (oa, _, done, *_), ob = a.step(f"<answer>{word}</answer>"), b.step(f"<answer>{word}</answer>")[0]
            assert np.array_equal(oa.images[0], ob.images[0])
            want = draw_grid(oa.text.splitlines(), TILE_COLORS, {"X": "_", "P": "_", "*": "O", "S": "O"}, 3)
            assert np.array_equal(oa.images[0], want)
            if done:
                break


def test_text_envs_are_unchanged_without_rgb_array():
    for mode in (None, "ansi"):
        env = SokobanEnv(render_mode=mode)
        obs, _ = env.reset(seed=1)
        assert isinstance(obs, str)
        assert isinstance(env.step("<answer>Up</answer>")[0], str)
    seen = SokobanEnv(render_mode="rgb_array")
    assert seen.reset(seed=1)[0].text == SokobanEnv().reset(seed=1)[0]


def test_frozen_lake_frame_moves_with_the_player():
    env = make_env("frozen_lake", {"render_mode": "rgb_array", "tile_pixels": 4, "size": 4})
    assert isinstance(env, FrozenLakeTextEnv)
    obs, _ = env.reset(seed=0, options={"desc": ["SFFF", "FHFH", "FFFH", "HFFG"]})
    assert obs.text.splitlines()[0] == "P___" and obs.images[0].shape == (16, 16, 3)
    obs2, *_ = env.step("<answer>Right</answer>")
    changed = {(int(r) // 4, int(c) // 4) for r, c in np.argwhere((obs2.images[0] != obs.images[0]).any(-1))}
    assert changed == {(0, 0), (0, 1)}


def test_bad_tile_pixels_names_the_key():
    with pytest.raises(ValueError, match="tile_pixels=0"):
        SokobanEnv(tile_pixels=0)


def test_observation_images_are_normalized_to_uint8_rgb():
    from PIL import Image

    gray = np.full((2, 3), 7, dtype=np.int64)
    pil = Image.new("RGBA", (3, 2), (1, 2, 3, 4))
    images = observation_images(Observation("x", (gray, pil)))
    assert [im.shape for im in images] == [(2, 3, 3), (2, 3, 3)] and all(im.dtype == np.uint8 for im in images)
    assert tuple(images[1][0, 0]) == (1, 2, 3) and observation_text(Observation("x")) == "x"
    assert observation_images("text") == [] and observation_text("text") == "text"
    with pytest.raises(ValueError, match=r"Observation.images\[0\]"):
        observation_images(Observation("x", (np.zeros((2, 2, 4)),)))


def test_an_env_without_frames_refuses_rgb_array():
    with pytest.raises(ValueError, match="render_mode='rgb_array'"):
        make_env("countdown", {"render_mode": "rgb_array"})
