"""The RLVR pipeline: prompts -> ``num_return_sequences_in_group`` responses each -> rule rewards (reward workers)
-> optional group filtering -> log-probs -> reward post-processing -> advantages -> PPO update -> weight sync.

Orchestration only: data loading in ``roll.data.rlvr_dataset``, rewards in ``roll.rewards``, group filters in
``roll.pipelines.dynamic_sampling``, math in ``roll.algorithms``, backends behind ``roll.strategies``.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field

import torch

from roll.config.rlvr import RLVRConfig
from roll.config.worker import GeneratingArgs
from roll.data.batch import Batch
from roll.data.checks import check_batch_if
from roll.data.files import resolve_data_files
from roll.data.layout import prompt_response_batch, response_log_probs
from roll.data.rlvr_dataset import RLVRExample, encode_prompts, load_rlvr_dataset
from roll.errors import RunStopped
from roll.pipelines.base import Pipeline
from roll.pipelines.dynamic_sampling import PromptSampler, collect_groups, group_stats
from roll.pipelines.step_metrics import logprob_mismatch, perf_metrics
from roll.rewards.workers import NonFiniteReward, RewardTimeout
from roll.rollout.buffer import Group
from roll.rollout.client import generation_client
from roll.tracking.dumps import TrajectoryDumps

HEADLINE_KEYS = ["rollout/accuracy", "rollout/mean_reward", "val/accuracy", "actor/pg_loss", "time/step"]


@dataclass
class PromptGroup:
    """One prompt (dataset index ``index``) and its responses, each with its reward outcome."""

    index: int
    prompt_ids: list[int]
    response_ids: list[list[int]]
    texts: list[str]
    scores: list[float]
    correct: list[bool]
    format_ok: list[bool]
    truncated: list[bool]  # generation hit max_new_tokens without an end token
    log_probs: list[list[float]] = field(default_factory=list)  # the engine's log-prob of each generated token
    policy_version: int = 0  # the oldest policy version among the responses' tokens (async rollouts)


def engine_log_probs(groups: list[PromptGroup], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The inference engine's log-probs of the responses of :func:`groups_to_batch`'s batch (log-prob frame)."""
    prompt_lengths = [len(g.prompt_ids) for g in groups for _ in g.response_ids]
    log_probs = [lps for g in groups for lps in (g.log_probs or [[]] * len(g.response_ids))]
    return response_log_probs(prompt_lengths, log_probs, width)


def groups_to_batch(groups: list[PromptGroup], examples: list[RLVRExample], pad_id: int) -> Batch:
    """The training batch of a step; ``group_id`` (meta) = position of the prompt in the step (0..G-1)."""
    prompts = [g.prompt_ids for g in groups for _ in g.response_ids]
    batch = prompt_response_batch(
        prompts, [r for g in groups for r in g.response_ids], [s for g in groups for s in g.scores], pad_id
    )
    batch["group_id"] = [k for k, g in enumerate(groups) for _ in g.response_ids]
    batch["tag"] = [examples[g.index].tag for g in groups for _ in g.response_ids]
    batch["prompt_index"] = [g.index for g in groups for _ in g.response_ids]
    return batch


def rollout_metrics(groups: list[PromptGroup], examples: list[RLVRExample], prefix: str) -> dict[str, float]:
    """Accuracy (overall and per tag), mean reward, format rate, response length, truncation, no-signal groups."""
    flat = [
        (examples[g.index].tag, c, s, f, len(r), t)
        for g in groups
        for c, s, f, r, t in zip(g.correct, g.scores, g.format_ok, g.response_ids, g.truncated)
    ]
    n = max(1, len(flat))
    metrics = {
        f"{prefix}/accuracy": sum(x[1] for x in flat) / n,
        f"{prefix}/mean_reward": sum(x[2] for x in flat) / n,
        f"{prefix}/format_rate": sum(x[3] for x in flat) / n,
        f"{prefix}/response_length": sum(x[4] for x in flat) / n,
        f"{prefix}/truncated_rate": sum(x[5] for x in flat) / n,
        f"{prefix}/generated_tokens": float(sum(x[4] for x in flat)),
    }
    if len(groups[0].scores) > 1:
        metrics[f"{prefix}/zero_std_groups"] = sum(group_stats(g.scores)[1] < 1e-6 for g in groups) / len(groups)
    by_tag: dict[str, list[bool]] = defaultdict(list)
    for tag, correct, *_ in flat:
        by_tag[tag].append(correct)
    for tag, values in by_tag.items():
        metrics[f"{prefix}/{tag}/accuracy"] = sum(values) / len(values)
    return metrics


def data_corpus(examples: list[RLVRExample], cfg: RLVRConfig) -> list[str]:
    """Text for the tiny model's tokenizer: prompts, system prompt, answer formats and numbers."""
    lines = [cfg.system_prompt or ""]
    for ex in examples:
        lines.append(ex.prompt if isinstance(ex.prompt, str) else "\n".join(m["content"] for m in ex.prompt))
        lines.append(cfg.sft_warmup.answer_template.format(answer=ex.ground_truth))
        lines.append(f"The answer is \\boxed{{{ex.ground_truth}}}. #### {ex.ground_truth}")
    return lines + [str(n) for n in range(200)]


def reward_stop(phase: str, step: int, exc: Exception) -> RunStopped:
    """The one line a non-finite or hung reward stops the run with (under Ray the message sits among the actor's
    lines)."""
    line = next((x for x in str(exc).splitlines() if "reward function" in x), str(exc)).strip()
    return RunStopped(f"{phase} step {step}: {line}")


class RLVRPipeline(Pipeline):
    """Prompts -> grouped responses -> rule rewards -> advantages -> update; ``run()`` (see :class:`Pipeline`)
    returns the last step's metrics."""

    cfg: RLVRConfig
    headline_keys = HEADLINE_KEYS
    seed_determines = "the prompt order"

    # ------------------------------------------------------------------ setup
    def _load(self, files: list[str]) -> list[RLVRExample]:
        args, cfg = self.cfg.actor_train.data_args, self.cfg
        return load_rlvr_dataset(
            files,
            prompt_key=args.prompt or "prompt",
            messages_key=args.messages,
            ground_truth_key=cfg.ground_truth_key,
            tag_key=cfg.tag_key,
            default_tag=cfg.default_tag,
        )

    def _encode(self, examples: list[RLVRExample], what: str) -> tuple[list[RLVRExample], list[list[int]]]:
        cfg = self.cfg
        ids, report = encode_prompts(
            examples,
            self.tokenizer,
            prompt_length=cfg.prompt_length,
            truncation=cfg.truncation,
            filter_overlong_prompts=cfg.filter_overlong_prompts,
            system_prompt=cfg.system_prompt,
        )
        if report.filtered_rows or report.truncated_rows:
            print(
                f"[rlvr] {what}: {len(report.filtered_rows)} overlong prompts filtered, "
                f"{len(report.truncated_rows)} truncated (longest {report.max_length} tokens)",
                flush=True,
            )
        if not ids:
            raise ValueError(f"{what}: every prompt is longer than prompt_length={cfg.prompt_length}; raise it")
        return [examples[i] for i in report.kept], ids

    def setup(self, run_id: str | None = None) -> None:
        """Load and encode data (errors surface before any worker starts), start workers, rewards, tracker
        (``run_id``: continue that tracker run, when resuming)."""
        from roll.models.loading import load_tokenizer
        from roll.rewards.workers import RewardWorkerPool

        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        train = self._load(resolve_data_files(cfg.actor_train.data_args.file_name))
        val = self._load(resolve_data_files(cfg.validation.file_name)) if cfg.validation.file_name else []
        if cfg.validation.max_samples:
            val = val[: cfg.validation.max_samples]
        model_path = cfg.actor_train.model_args.model_name_or_path or cfg.pretrain
        if cfg.tiny_model is not None:
            self.build_tiny_model(corpus=data_corpus(train + val, cfg))
        self.tokenizer = load_tokenizer(model_path)
        self.dumps = TrajectoryDumps(self.log_dir, cfg.rollout_dump_steps, cfg.rollout_dump_max, self.tokenizer, "rlvr")
        self.train_examples, self.train_prompts = self._encode(train, "train data")
        self.val_examples, self.val_prompts = self._encode(val, "validation data") if val else ([], [])
        self.start_roles(extra_cpus=cfg.rewards.num_workers * cfg.rewards.num_cpus_per_worker)
        self.generator = generation_client(self.roles.actor_infer)
        self.round_stats: list[tuple[dict[str, float], dict[str, float]]] = []  # async: rounds since the last take
        self.round_lock = threading.Lock()
        self.rewards = RewardWorkerPool(
            cfg.rewards.num_workers,
            use_ray=cfg.distributed == "ray",
            num_cpus_per_worker=cfg.rewards.num_cpus_per_worker,
            reward_options=dict(cfg.rewards.reward_options),
            tag_to_reward=dict(cfg.rewards.tag_to_reward),
            timeout_s=cfg.rewards.timeout_s,
        )
        self.sampler = PromptSampler(len(self.train_prompts), cfg.seed)
        self.start_tracker(run_id, headline_keys=HEADLINE_KEYS)

    # ------------------------------------------------------------------ phases
    def generate_groups(
        self,
        indices: list[int],
        examples: list[RLVRExample],
        prompts: list[list[int]],
        n: int,
        args: GeneratingArgs,
        times: dict[str, float] | None = None,
    ) -> list[PromptGroup]:
        """``n`` responses for each prompt in ``indices`` (one batched request), scored by the reward workers;
        ``times`` accumulates the seconds of phase switches (``switch``) and generate calls (``generate``)."""
        times = {} if times is None else times
        start = time.perf_counter()
        self.phases.activate(self.groups, {"actor_infer"})
        times["switch"] = times.get("switch", 0.0) + time.perf_counter() - start
        start = time.perf_counter()
        expanded = [prompts[i] for i in indices for _ in range(n)]
        outs = self.generator.generate(expanded, args)
        times["generate"] = times.get("generate", 0.0) + time.perf_counter() - start
        # the stop token is cut, other special tokens are kept: markup such as <answer> may be a special token
        texts = self.tokenizer.batch_decode(
            [o.token_ids[:-1] if o.finish_reason == "stop" else o.token_ids for o in outs], skip_special_tokens=False
        )
        exs = [examples[i] for i in indices for _ in range(n)]
        results = self.rewards.compute(texts, [e.ground_truth for e in exs], [e.tag for e in exs])
        groups = []
        for k, i in enumerate(indices):
            part = slice(k * n, (k + 1) * n)
            groups.append(
                PromptGroup(
                    i,
                    prompts[i],
                    [o.token_ids for o in outs[part]],
                    texts[part],
                    [r.score for r in results[part]],
                    [r.correct for r in results[part]],
                    [r.format_ok for r in results[part]],
                    [o.finish_reason == "length" for o in outs[part]],
                    [o.log_probs for o in outs[part]],
                    min(o.policy_version for o in outs[part]),
                )
            )
        return groups

    def collect(self) -> tuple[list[PromptGroup], dict[str, float], dict[str, float]]:
        """One step's prompt groups (dynamic sampling's rounds included): ``(groups, metrics, times)``."""
        cfg, times = self.cfg, {"switch": 0.0, "generate": 0.0}

        def run_round(k: int) -> list[PromptGroup]:
            return self.generate_groups(
                self.sampler.draw(k),
                self.train_examples,
                self.train_prompts,
                cfg.num_return_sequences_in_group,
                cfg.actor_infer.generating_args,
                times,
            )

        groups, metrics = collect_groups(
            cfg.rollout_batch_size,
            run_round,
            cfg.dynamic_sampling,
            cfg.is_use_additional_prompts,
            cfg.max_additional_running_prompts,
        )
        return groups, metrics, times

    def warm_start(self) -> dict[str, float]:
        """Supervised warm start on ``answer_template`` renderings of the train answers, then sync."""
        sft = self.cfg.sft_warmup
        order = list(range(len(self.train_examples)))
        random.Random(sft.seed).shuffle(order)
        order = order[: sft.max_examples or None]
        eos = [self.tokenizer.eos_token_id]

        def batches():
            for step in range(sft.steps):
                picked = [order[(step * sft.batch_size + j) % len(order)] for j in range(sft.batch_size)]
                answers = [sft.answer_template.format(answer=self.train_examples[i].ground_truth) for i in picked]
                responses = [self.tokenizer.encode(a, add_special_tokens=False) + eos for a in answers]
                yield prompt_response_batch(
                    [self.train_prompts[i] for i in picked], responses, [0.0] * len(picked), self.tokenizer.pad_token_id
                )

        return self.train_sft(batches(), sft.steps, sft.learning_rate, reset_optimizer=False)

    def validate(self, step: int) -> dict[str, float]:
        """One greedy (by default) response per validation prompt; accuracy overall and per tag."""
        start = time.perf_counter()
        try:
            groups = self.generate_groups(
                list(range(len(self.val_prompts))),
                self.val_examples,
                self.val_prompts,
                1,
                self.cfg.validation.generating_args,
            )
        except (NonFiniteReward, RewardTimeout) as exc:
            raise reward_stop("val", step, exc) from exc
        self.dumps.rlvr("val", step, groups, self.val_examples)
        metrics = rollout_metrics(groups, self.val_examples, "val")
        metrics["val/batch_size"] = float(sum(len(g.response_ids) for g in groups))
        metrics["time/val"] = time.perf_counter() - start
        return metrics

    def produce(self, producer: int, round_: int, version: int) -> list[Group]:
        """One round of ``rollout_batch_size`` prompt groups (async_generation_ratio >= 1, in a producer thread);
        its dynamic-sampling metrics and times are merged into the step that takes the next batch."""
        groups, metrics, times = self.collect()
        with self.round_lock:
            self.round_stats.append((metrics, times))
        return [Group(g, g.policy_version, sum(map(len, g.response_ids)) / len(g.response_ids)) for g in groups]

    def take(self) -> tuple[list[PromptGroup], dict[str, float], dict[str, float]]:
        """The oldest ``rollout_batch_size`` finished groups of the producers (started on first use), with the
        staleness metrics, the latest round's metrics and the rounds' summed times."""
        cfg = self.cfg
        producers = self.start_producers(
            self.produce, [cfg.rollout_batch_size], cfg.rollout_batch_size, lambda g: PromptGroup(**g)
        )
        taken, metrics = producers.buffer.take(cfg.rollout_batch_size)
        with self.round_lock:
            rounds, self.round_stats = self.round_stats, []
        times = {"switch": 0.0, "generate": 0.0}
        for round_metrics, round_times in rounds:
            metrics = {**round_metrics, **metrics}
            times = {k: times[k] + round_times.get(k, 0.0) for k in times}
        return [g.items for g in taken], metrics, times

    def train_step(self, step: int) -> dict[str, float]:
        """Collect a batch of prompt groups, score, compute advantages, update the actor, sync weights. With
        ``async_generation_ratio`` k >= 1 a producer thread generates rounds of prompt groups on whatever weights
        the engine has (the sync lands between its generate calls) and the step takes the oldest finished ones,
        at most k policy versions old (:mod:`roll.rollout.buffer`)."""
        cfg, timings = self.cfg, {}
        t0 = time.perf_counter()
        try:
            prompt_groups, metrics, times = self.take() if cfg.async_generation_ratio else self.collect()
        except (NonFiniteReward, RewardTimeout) as exc:  # named at its source: the reward function and the sample
            raise reward_stop("train", step, exc) from exc
        except RuntimeError as exc:  # a producer's reward error arrives wrapped
            if isinstance(exc.__cause__, (NonFiniteReward, RewardTimeout)):
                raise reward_stop("train", step, exc.__cause__) from exc
            raise
        timings["time/rollout"] = time.perf_counter() - t0  # async: waiting for the oldest finished groups
        batch = groups_to_batch(prompt_groups, self.train_examples, self.tokenizer.pad_token_id)
        batch["rollout_log_probs"], batch["rollout_log_prob_mask"] = engine_log_probs(
            prompt_groups, batch["input_ids"].shape[1]
        )
        check_batch_if(cfg.strict_data_check, batch, "rollout")
        t = time.perf_counter()
        self.phases.activate(self.groups, {"actor_train", "reference", "critic"})
        timings["time/offload_reload"] = times["switch"] + time.perf_counter() - t
        timings["time/rollout_generate"] = times["generate"]
        timings.update(self.trainer.log_probs(step, batch))
        metrics.update(self.trainer.advantages(batch, step))
        self.dumps.rlvr("train", step, prompt_groups, self.train_examples, batch)
        metrics.update(self.trainer.update(step, batch, metrics.get("actor/reward_kl")))
        metrics.update(logprob_mismatch(batch))
        metrics.update(perf_metrics(self.roles, batch, metrics, cfg.ppo_epochs))  # reads time/train
        # updates between the batch's (oldest) weights and the trained ones
        metrics["rollout/policy_lag"] = metrics.get("rollout/staleness_mean", 0.0)
        timings["time/step"] = time.perf_counter() - t0
        metrics.update(rollout_metrics(prompt_groups, self.train_examples, "rollout"))
        metrics.update(timings)
        return metrics

    def can_validate(self) -> bool:
        return bool(self.val_prompts)

    def driver_state(self) -> dict:
        """The prompt stream position, the running reward statistics and (async rollouts, taken first: the
        producers stop between rounds) the finished groups waiting and the producers' rounds."""
        state = {"async": self.producers.state_dict(asdict)} if self.producers is not None else {}
        return {**state, "sampler": self.sampler.state_dict(), "running_reward": self.trainer.normalizer.state_dict()}

    def load_driver_state(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])
        self.trainer.normalizer.load_state_dict(state["running_reward"])
        self.async_state = state.get("async")

    def finish(self) -> None:
        if (
            self.producers is not None
        ):  # its round (one generate call and its rewards) ends before the reward workers go
            self.producers.close()
        self.rewards.shutdown()
