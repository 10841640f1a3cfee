"""Turns and trajectories of multi-turn episodes, and their conversion to a training :class:`Batch`.

Ids: ``traj_id = "{phase}-{step}-g{group_id}-e{env_index}-t{k}"`` (k-th trajectory of that env in the step);
``env_id`` is the env's index within its manager's groups; ``group_id`` is the global group index.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from roll.data.batch import Batch


@dataclass
class Turn:
    """One model turn: the tokens given before it, the tokens it produced, and what the env made of them."""

    prompt_ids: list[int]  # tokens appended before this reply (first prompt, or the delta after the last reply)
    response_ids: list[int]  # generated tokens, ending with the end-of-turn token unless cut by length
    response_log_probs: list[float]
    observation: str  # the observation shown in prompt_ids
    response_text: str = ""
    parsed_action: str | None = None
    action_is_valid: bool = False
    reward: float = 0.0
    finish_reason: str = "stop"
    appended_eos: bool = False  # an end-of-turn token was added after a length-cut reply (not trained on)


@dataclass
class Trajectory:
    """One episode of one env: its turns, outcome and ids."""

    traj_id: str
    env_id: int
    group_id: int
    tag: str
    seed: int
    turns: list[Turn] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)  # the conversation (for conformance/dumps)
    success: bool = False
    terminated: bool = False
    truncated_by_length: bool = False
    failure: str | None = None  # an env error or timeout, recorded instead of crashing the rollout
    failure_kind: str | None = None  # "error" (reset/step raised) or "timeout" (no return within env_step_timeout)
    template_conforms: bool | None = None  # token ids == chat template of the whole conversation (None: unchecked)
    env_metrics: dict[str, float] = field(default_factory=dict)
    final_observation: str | None = None  # what the env showed after the last action (None: no step completed)

    @property
    def score(self) -> float:
        """Episode score: the sum of the env's rewards (format penalties included)."""
        return float(sum(t.reward for t in self.turns))

    @property
    def num_actions(self) -> int:
        return sum(1 for t in self.turns if t.parsed_action is not None or t.response_ids)

    def token_ids(self) -> list[int]:
        """The whole conversation as token ids, exactly as the model saw and produced them."""
        ids: list[int] = []
        for turn in self.turns:
            ids += turn.prompt_ids + turn.response_ids
        return ids

    def pending_ids(self, next_prompt: list[int]) -> list[int]:
        """The ids to generate from when ``next_prompt`` is appended."""
        return self.token_ids() + next_prompt


def trajectories_to_batch(trajectories: list[Trajectory], pad_id: int) -> Batch:
    """One sample per trajectory, right-padded.

    ``response_mask`` is 1 on generated tokens of every turn (not on prompts, observations or an appended
    end-of-turn token); ``token_level_scores`` (B, L-1) holds the episode score at the last response token,
    aligned with ``input_ids[:, 1:]`` like the log-probs.
    """
    seqs, masks = [], []
    for traj in trajectories:
        ids, mask = [], []
        for turn in traj.turns:
            ids += turn.prompt_ids
            mask += [0] * len(turn.prompt_ids)
            gen = len(turn.response_ids) - (1 if turn.appended_eos else 0)
            ids += turn.response_ids
            mask += [1] * gen + [0] * (len(turn.response_ids) - gen)
        seqs.append(ids)
        masks.append(mask)
    width = max(len(s) for s in seqs)
    n = len(seqs)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    response_mask = torch.zeros((n, width), dtype=torch.long)
    token_level_scores = torch.zeros((n, width - 1), dtype=torch.float32)
    scores = torch.tensor([t.score for t in trajectories], dtype=torch.float32)
    for i, (ids, mask) in enumerate(zip(seqs, masks)):
        input_ids[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, :len(ids)] = 1
        response_mask[i, :len(mask)] = torch.tensor(mask, dtype=torch.long)
        positions = response_mask[i].nonzero().flatten()
        if len(positions):
            token_level_scores[i, positions[-1] - 1] = scores[i]  # log-prob index t predicts token t + 1
    return Batch(
        tensors={"input_ids": input_ids, "attention_mask": attention_mask, "response_mask": response_mask,
                 "scores": scores, "token_level_scores": token_level_scores},
        meta={"traj_id": [t.traj_id for t in trajectories], "env_id": [t.env_id for t in trajectories],
              "group_id": [t.group_id for t in trajectories], "tag": [t.tag for t in trajectories],
              "step_rewards": [[turn.reward for turn in t.turns] for t in trajectories],
              "truncated_by_length": [t.truncated_by_length for t in trajectories],
              "success": [t.success for t in trajectories]},
    )
