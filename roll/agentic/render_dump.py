"""Rendered frames of validation episodes (``render_save_dir``).

Episodes are replayed, not recorded live: each trajectory's env is rebuilt from its tag's ``custom_envs`` entry
with a render mode, reset with the trajectory's seed and stepped with the model's replies in order, rendering
once after the reset and once after every step. Env dynamics depend only on (seed, actions), so the replay
reproduces the episode; ``episode.json`` records whether the replayed rewards equal the recorded ones.

Layout: ``<render_save_dir>/step_<step:05d>/<traj_id>/frame_<k:03d>.png`` (``rgb_array`` envs, PNG via Pillow)
or ``frame_<k:03d>.txt`` (``ansi``), plus ``episode.json`` (seed, score, success, actions, rewards).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from roll.data.trajectory import Trajectory


def pick_render_mode(env_cls: type) -> str | None:
    """``rgb_array`` when the env offers it and Pillow can write PNGs, else ``ansi``, else None."""
    modes = list(getattr(env_cls, "metadata", {}).get("render_modes", []))
    if "rgb_array" in modes:
        try:
            import PIL.Image  # noqa: F401
        except ImportError:
            pass
        else:
            return "rgb_array"
    return "ansi" if "ansi" in modes else None


def _write_frame(frame: Any, path_stem: Path) -> None:
    if isinstance(frame, str):
        path_stem.with_suffix(".txt").write_text(frame + "\n")
    elif frame is not None:
        from PIL import Image

        Image.fromarray(frame).save(path_stem.with_suffix(".png"))


def dump_episode(traj: Trajectory, env_type: str, env_kwargs: dict[str, Any], out_dir: Path) -> int:
    """Replay one trajectory with rendering into ``out_dir``; returns the number of frames written."""
    from roll.envs.registry import get_env_class, make_env

    mode = pick_render_mode(get_env_class(env_type))
    if mode is None:
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    env = make_env(env_type, {**env_kwargs, "render_mode": mode})
    env.reset(seed=traj.seed)
    _write_frame(env.render(), out_dir / "frame_000")
    frames, rewards = 1, []
    for turn in traj.turns:
        try:
            _, reward, terminated, truncated, _ = env.step(turn.response_text)
        except Exception:  # the recorded episode ended on an env error at this turn
            break
        rewards.append(float(reward))
        _write_frame(env.render(), out_dir / f"frame_{frames:03d}")
        frames += 1
        if terminated or truncated:
            break
    env.close()
    recorded = [t.reward for t in traj.turns]
    (out_dir / "episode.json").write_text(
        json.dumps(
            {
                "traj_id": traj.traj_id,
                "tag": traj.tag,
                "seed": traj.seed,
                "render_mode": mode,
                "score": traj.score,
                "success": traj.success,
                "actions": [t.parsed_action for t in traj.turns],
                "rewards": recorded,
                "replay_consistent": rewards == recorded,
            },
            indent=1,
        )
    )
    return frames


def dump_val_renders(cfg: Any, trajs: Sequence[Trajectory], step: int) -> int:
    """Write rendered frames of validation ``trajs`` under ``cfg.render_save_dir``; no-op when it is unset.

    Returns the number of frames written.
    """
    if not cfg.render_save_dir or cfg.val_env_manager is None:
        return 0
    manager = cfg.val_env_manager
    root = Path(cfg.render_save_dir) / f"step_{step:05d}"
    total = 0
    for traj in trajs:
        spec = cfg.custom_envs[traj.tag]
        kwargs = spec.env_kwargs(manager.format_penalty, manager.action_format)
        total += dump_episode(traj, spec.env_type, kwargs, root / traj.traj_id)
    return total


def env_descriptions(cfg: Any) -> dict[str, dict[str, Any]]:
    """Per env tag of ``cfg.custom_envs``: its ``env_type`` and ``grid_symbols`` (see
    :class:`~roll.envs.base.TextEnv`), which trajectory dumps record so that viewers draw boards; a tag played by an
    agent harness through the gateway is ``{"env_type": null, "agent_runner": <agent_runner_cls>, "grid_symbols":
    null}`` (its episodes are conversations, whatever env it names)."""
    from roll.envs.registry import get_env_class

    return {
        tag: (
            {"env_type": None, "agent_runner": spec.agent_runner_cls, "grid_symbols": None}
            if spec.uses_gateway
            else {"env_type": spec.env_type, "grid_symbols": get_env_class(spec.env_type).grid_symbols}
        )
        for tag, spec in cfg.custom_envs.items()
    }
