"""Agent runners: one episode of an agent harness against the gateway, returning its reward.

``custom_envs.<tag>.agent_runner_cls`` (ROLL's key) names one of three things by import path
(``package.module.Name`` or ``package.module:Name``):

- a subclass of :class:`AgentRunner` (built with ``agent_runner_kwargs``);
- a plain function ``fn(task: AgentTask, **agent_runner_kwargs)`` that uses the ``openai`` package with
  ``task.base_url`` and ``task.api_key``;
- :class:`CommandRunner`, which starts an external program (any language) per episode with
  ``agent_runner_kwargs: {command: [...]}``;
- :class:`EnvRunner`, which plays the tag's roll env through the API (ROLL's ``GEMRunner`` maps to it).

A runner returns the episode reward (a float), an :class:`AgentResult`, or None when the harness posted its reward
to ``POST /v1/reward`` itself. An exception or a run past ``agent_timeout`` ends the trajectory as a failure, counted
like a failing env (:mod:`roll.agentic.failures`).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from roll.config.agentic import CustomEnvConfig
from roll.envs.base import observation_images, observation_text


@dataclass
class AgentTask:
    """What a runner gets for one episode (``from roll.agentic.gateway.runners import AgentTask``).

    Attributes:
        base_url: the gateway's OpenAI base URL, ``http://127.0.0.1:<port>/v1``.
        api_key: this episode's session key (valid while the episode runs, for its own session only).
        model: the model name to send (any name is accepted).
        seed: the episode's seed; the episodes of a group share it (the same task).
        tag: the ``custom_envs`` tag.
        env: the tag's config block (``env_type``, ``env_config``, ``max_actions_per_traj``, ...), for harnesses
            that play a roll env behind their own API (:class:`EnvRunner`).
        format_penalty: the env manager block's, for harnesses that build a roll env.
        action_format: the env manager block's, likewise.
        group_id: the group's index (global over the rollout).
        env_id: the episode's index within its group.
        phase: ``"train"`` or ``"val"``.
    """

    base_url: str
    api_key: str
    model: str
    seed: int
    tag: str
    env: CustomEnvConfig
    format_penalty: float
    action_format: str
    group_id: int
    env_id: int
    phase: str

    @property
    def max_turns(self) -> int:
        """Model calls the harness should stop at (``custom_envs.<tag>.max_actions_per_traj``)."""
        return self.env.max_actions_per_traj

    @property
    def timeout_s(self) -> float:
        """``agent_timeout``: the episode is abandoned after this many seconds (0 = no limit)."""
        return self.env.agent_timeout


@dataclass
class AgentResult:
    """An episode's outcome (``from roll.agentic.gateway.runners import AgentResult``).

    Attributes:
        reward: added to the episode's last turn (per-turn rewards posted to ``/v1/reward`` stay on their turns).
        success: counted in ``rollout/success_rate``; None means ``reward > 0``.
        metrics: numbers the harness measured, each logged as ``env/<tag>/<name>`` (its mean over the step's
            episodes; validation: ``val/env/<tag>/<name>``).
    """

    reward: float
    success: bool | None = None
    metrics: dict[str, float] = field(default_factory=dict)


RunnerReturn = float | int | AgentResult | None


class RunnerArgumentsError(TypeError):
    """``agent_runner_kwargs`` do not fit the runner (the message names what it takes)."""


class AgentRunner(ABC):
    """Runs one episode of an agent against the gateway; one instance serves every episode of a tag (so ``run``
    is called from several threads at once)."""

    @abstractmethod
    def run(self, task: AgentTask) -> RunnerReturn:
        """Play one episode through ``task.base_url`` with ``task.api_key``; return its reward (see the module
        docstring for the forms)."""


class FunctionRunner(AgentRunner):
    """A plain function ``fn(task, **kwargs)`` as a runner; ``kwargs`` (``agent_runner_kwargs``) must be keyword
    arguments of ``fn`` (checked here, before any episode)."""

    def __init__(self, fn: Callable[..., RunnerReturn], **kwargs: Any):
        import inspect

        try:
            inspect.signature(fn).bind(None, **kwargs)
        except TypeError as exc:
            params = [p for p in inspect.signature(fn).parameters][1:]
            raise RunnerArgumentsError(
                f"agent_runner_kwargs {sorted(kwargs)} do not fit {getattr(fn, '__name__', fn)}(task, ...) ({exc}); "
                f"it takes {', '.join(params) or 'no keyword arguments'}"
            ) from None
        except ValueError:  # a callable without a signature: checked when called
            pass
        self.fn, self.kwargs = fn, kwargs

    def run(self, task: AgentTask) -> RunnerReturn:
        return self.fn(task, **self.kwargs)


class CommandRunner(AgentRunner):
    """An external program per episode. It gets ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``OPENAI_MODEL``,
    ``ROLL_SEED`` and ``ROLL_TASK`` (the :class:`AgentTask` as JSON) in its environment, and reports its reward as
    the last line of its standard output (a number), or posts it to ``/v1/reward`` and prints nothing.

    Args:
        command: the program and its arguments (no shell).
        cwd: working directory (None: the manager's).
    A non-zero exit is an error naming the exit code and the last line of standard error; at ``task.timeout_s`` the
    program's process group is killed.
    """

    def __init__(self, command: list[str], cwd: str | None = None):
        if not command or not all(isinstance(c, str) for c in command):
            raise ValueError(f"CommandRunner: command must be a non-empty list of strings, got {command!r}")
        self.command, self.cwd = list(command), cwd

    def run(self, task: AgentTask) -> RunnerReturn:
        env = {
            **os.environ,
            "OPENAI_BASE_URL": task.base_url,
            "OPENAI_API_KEY": task.api_key,
            "OPENAI_MODEL": task.model,
            "ROLL_SEED": str(task.seed),
            "ROLL_TASK": json.dumps(asdict(task)),
        }
        proc = subprocess.Popen(
            self.command,
            cwd=self.cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=task.timeout_s or None)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise TimeoutError(f"{self.command[0]} ran past agent_timeout={task.timeout_s}s (killed)") from None
        if proc.returncode != 0:
            last = (err.strip().splitlines() or [""])[-1]
            raise RuntimeError(f"{' '.join(self.command)} exited with code {proc.returncode}: {last}")
        lines = out.strip().splitlines()
        if not lines:
            return None
        try:
            return float(lines[-1])
        except ValueError:
            raise ValueError(
                f"{self.command[0]}: the last line of its output must be the reward (a number), got {lines[-1][:80]!r}"
            ) from None


def observation_content(text: str, observation: Any) -> str | list[dict[str, Any]]:
    """A message's ``content`` for an env observation: ``text``, or, when the observation has images
    (:class:`roll.envs.base.Observation`), each image as an ``image_url`` part (a PNG data URL) and then the text,
    the order roll's env manager shows them in."""
    images = observation_images(observation)
    if not images:
        return text
    from roll.agentic.gateway.images import image_url_part

    return [*[image_url_part(image) for image in images], {"type": "text", "text": text}]


class EnvRunner(AgentRunner):
    """The tag's roll env played through the OpenAI API, with the messages roll's env manager builds (system prompt,
    ``first_turn_template``, ``turn_template``); each step's reward is posted per turn. An env that shows images
    (``env_config: {render_mode: rgb_array}``) sends them as ``image_url`` parts before the text
    (:func:`observation_content`). ROLL's ``GEMRunner`` (a GEM env behind the proxy) maps here."""

    def run(self, task: AgentTask) -> RunnerReturn:
        import openai

        from roll.envs import make_env

        env = make_env(task.env.env_type, task.env.env_kwargs(task.format_penalty, task.action_format))
        obs, info = env.reset(seed=task.seed)
        client = openai.OpenAI(
            base_url=task.base_url, api_key=task.api_key, max_retries=0, timeout=task.timeout_s or None
        )
        messages: list[Any] = []  # OpenAI messages (content: text or parts)
        if task.env.system_prompt:
            messages.append({"role": "system", "content": task.env.system_prompt})
        messages.append(
            {
                "role": info.get("message_role", "user"),
                "content": observation_content(
                    task.env.turn_text(0, observation_text(obs), instruction=info["env_instruction"]), obs
                ),
            }
        )
        success, metrics = False, {}
        for turn in range(task.max_turns):
            try:
                reply = client.chat.completions.create(model=task.model, messages=messages)
            except openai.BadRequestError as exc:
                if getattr(exc, "code", None) == "context_length_exceeded":
                    break
                raise
            text = reply.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": text})
            obs, reward, terminated, truncated, info = env.step(text)
            client.post("/reward", body={"reward": float(reward), "turn": -1}, cast_to=object)
            success, metrics = bool(info.get("success", False)), dict(info.get("metrics", {}))
            if terminated or truncated:
                break
            shown = task.env.turn_text(turn + 1, observation_text(obs), reward=reward)
            messages.append({"role": info.get("message_role", "user"), "content": observation_content(shown, obs)})
        return AgentResult(0.0, success, {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))})


def load_runner(name: str, kwargs: dict[str, Any] | None = None) -> AgentRunner:
    """The runner named by ``agent_runner_cls`` (an import path), built with ``kwargs``. The module is imported from
    the launch directory (the current directory, put on ``sys.path`` as for user envs), ``PYTHONPATH`` or the
    installed packages. Messages name the value, not the key (the config error adds it).

    Raises:
        ImportError: the module or name cannot be found (the message names both, and where modules come from).
        RunnerArgumentsError: ``kwargs`` do not fit the runner.
        TypeError: the name is neither an AgentRunner subclass nor a function.
    """
    module, sep, attr = name.partition(":") if ":" in name else name.rpartition(".")
    if not module or not sep:
        raise ImportError("expected an import path such as 'my_agents.harness.play' or 'my_agents.harness:play'")
    if os.getcwd() not in sys.path:  # a runner next to the launch directory, as with user envs
        sys.path.append(os.getcwd())
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ImportError(
            f"cannot import {attr!r} from {module!r} ({exc}); modules are imported from the launch directory "
            f"({os.getcwd()}), PYTHONPATH and the installed packages"
        ) from None
    kwargs = dict(kwargs or {})
    if isinstance(obj, type) and issubclass(obj, AgentRunner):
        try:
            return obj(**kwargs)
        except TypeError as exc:
            raise RunnerArgumentsError(f"{obj.__name__}(**agent_runner_kwargs) failed: {exc}") from None
    if callable(obj) and not isinstance(obj, type):
        return FunctionRunner(obj, **kwargs)
    raise TypeError(
        f"{obj!r} is neither a subclass of roll.agentic.gateway.runners.AgentRunner nor a function "
        f"fn(task, **agent_runner_kwargs)"
    )
