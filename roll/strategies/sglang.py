"""``sglang``: generation with an in-process ``sglang.Engine`` (token ids in, token ids out), for ``actor_infer``.

``strategy_config`` is :class:`~roll.config.strategies.SGLangOptions`: its engine fields (``mem_fraction_static``,
``tp_size``, ``attention_backend``, ... and ``engine_args`` for any other ``sglang.Engine`` argument) become the
Engine's keyword arguments (:func:`engine_kwargs`); its roll fields are ``weight_bucket_bytes`` (bytes per
``update_weights_from_tensor`` call in a weight sync), ``release_tags`` (what ``offload_states`` releases) and
``weight_sync`` (how actor_train's weights arrive; see :func:`roll.distributed.placement.weight_sync_mode`).

Requests: :meth:`SGLangStrategy.submit` queues requests (each its own SGLang request id), :meth:`poll` drives the
engine's event loop until one of the given requests finishes, :meth:`abort` aborts requests in flight. SGLang's
continuous batching batches whatever is in flight, so callers send each request as soon as it is ready.
``generate`` is submit + poll until all are done. ``n`` (``num_return_sequences``) is sent as ``n`` requests with ids
``rid#k`` sharing the prompt (SGLang's radix cache shares the prefix); outputs are prompt-major.

Weights: :meth:`load_weights` pushes buckets with ``update_weights_from_tensor``. While memory is released (the
colocated training phase), weights are kept on the host and pushed right after ``resume_memory_occupation`` (a
release frees the engine's weights). Disaggregated: :meth:`init_weight_group` + :meth:`update_weights_distributed`
receive NCCL broadcasts from the trainer (sender: :class:`roll.weights.group.WeightGroup`, driven by
:class:`roll.weights.sync.WeightSync`).
Partial rollouts: a weight push while requests are in flight (asynchronous rollouts) is bracketed by SGLang's
``pause_generation(mode="retract")`` and ``continue_generation`` (:meth:`SGLangStrategy.paused`): running
requests go back to the waiting queue with the tokens they have, the weights change, and they continue on the new
weights, their KV recomputed; no token is thrown away. SGLang's default pause mode, ``abort``, which ends
every request, is never used. SGLang cannot flush its cache while retracted requests wait (its scheduler asserts
on a failed flush after a weight update), so an update with requests in flight does not flush, and an
asynchronous run (``StrategyContext.async_rollouts``) starts the engine with ``disable_radix_cache`` (unless
``engine_args`` sets it): no prefix KV computed under older weights outlives an update. Each request keeps the policy
version it was submitted under (the oldest of its
tokens; :meth:`roll.distributed.worker.Worker.poll`).
Nothing here imports SGLang until :meth:`initialize`, so the module loads on CPU machines.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from typing import Any

import torch

from roll.config.lora import ALL_LINEAR, LoraSettings, lora_settings
from roll.config.strategies import WEIGHT_SYNC_CHOICES, SGLangOptions  # noqa: F401
from roll.config.worker import GeneratingArgs
from roll.data.batch import Batch
from roll.data.trajectory import prompt_images
from roll.models.loading import is_vision_config
from roll.models.vision import checkpoint_name, collapse_image_pads
from roll.strategies.base import GenerationOutput, InferenceStrategy, StrategyContext
from roll.weights.buckets import bucket_meta, iter_buckets
from roll.weights.ipc import rename_payload

#: Typed engine arguments of :class:`SGLangOptions` (roll's own keys are not passed to the Engine). The defaults
#: (``mem_fraction_static``, ``attention_backend="triton"``, ...) work on the lent H100/H200 bundles.
ENGINE_FIELDS = (
    "mem_fraction_static",
    "attention_backend",
    "sampling_backend",
    "enable_memory_saver",
    "disable_prefill_cuda_graph",
    "log_level",
    "context_length",
    "max_running_requests",
    "chunked_prefill_size",
    "disable_cuda_graph",
    "load_format",
)
DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
#: Request id separator: sample k of request ``rid`` is ``f"{rid}#{k}"``.
SAMPLE_SEP = "#"


def engine_kwargs(model_path: str, dtype: str, opts: SGLangOptions, seed: int, tp_size: int = 1) -> dict[str, Any]:
    """``sglang.Engine`` keyword arguments: the typed engine fields that are set, then ``engine_args``, then roll's
    own (``model_path``, ``skip_tokenizer_init``, ``random_seed``); ``dtype`` from the options or the model's."""
    kwargs = {name: getattr(opts, name) for name in ENGINE_FIELDS if getattr(opts, name) is not None}
    kwargs.update(tp_size=opts.tp_size or tp_size, **opts.engine_args)
    kwargs.update(model_path=model_path, skip_tokenizer_init=True, random_seed=seed)
    kwargs.setdefault("dtype", opts.dtype or DTYPE_NAMES.get(dtype, "auto"))
    return kwargs


def engine_tp_size(config: Any, options: SGLangOptions) -> int:
    """Tensor-parallel size of one engine of worker block ``config`` (typed ``options``): ``tp_size``, default
    ``num_gpus_per_worker``. Each engine holds that many ranks of a weight group."""
    return options.tp_size or config.num_gpus_per_worker


def sampling_params(args: GeneratingArgs, max_new_tokens: int | None, eos_token_id: int | None) -> dict[str, Any]:
    """SGLang sampling params of one request (``n`` is realized by fan-out, see the module docstring).

    Greedy (``do_sample=False`` or ``temperature <= 0``) -> ``temperature=0``; ``top_k <= 0`` -> ``-1`` (off);
    ``stop_token_ids`` = eos + ``args.stop_token_ids``.
    """
    greedy = not args.do_sample or args.temperature <= 0
    if args.num_beams != 1:
        raise ValueError(f"sglang: generating_args.num_beams={args.num_beams}; SGLang samples, set num_beams: 1")
    stop = sorted({*([eos_token_id] if eos_token_id is not None else []), *args.stop_token_ids})
    return {
        "max_new_tokens": int(max_new_tokens or args.max_new_tokens),
        "temperature": 0.0 if greedy else float(args.temperature),
        "top_p": 1.0 if greedy else float(args.top_p),
        "top_k": -1 if greedy or args.top_k <= 0 else int(args.top_k),
        "repetition_penalty": float(args.repetition_penalty),
        "stop_token_ids": [] if args.ignore_eos else stop,
        "ignore_eos": bool(args.ignore_eos),
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }


def parse_output(out: dict[str, Any]) -> GenerationOutput:
    """A SGLang result dict -> :class:`GenerationOutput` (ids, sampled-token log-probs, "stop"/"length"/"abort")."""
    meta = out.get("meta_info", {})
    reason = meta.get("finish_reason") or {}
    kind = reason.get("type", "stop") if isinstance(reason, dict) else str(reason)
    ids = list(out.get("output_ids") or [])
    log_probs = [float(entry[0]) for entry in meta.get("output_token_logprobs") or []]
    if len(log_probs) != len(ids):
        raise ValueError(
            f"sglang: {len(ids)} output ids but {len(log_probs)} log-probs in request "
            f"{meta.get('id')!r}; was return_logprob set?"
        )
    return GenerationOutput(ids, log_probs, {"stop": "stop", "length": "length"}.get(kind, "abort"))


def pil_images(images: Iterable[Any]) -> list[Any]:
    """H x W x 3 uint8 arrays as PIL images, SGLang's ``image_data``."""
    from PIL import Image

    return [Image.fromarray(image) for image in images]


class RequestTracker:
    """Request bookkeeping over an engine with ``async_generate`` and ``tokenizer_manager.abort_request``.

    ``submit`` schedules one asyncio task per request on ``loop`` (nothing runs yet); ``poll`` runs the loop until
    one of the asked-for requests finishes or ``timeout`` passes, and hands back finished ones (each exactly once).
    """

    def __init__(self, engine: Any, loop: asyncio.AbstractEventLoop, image_pad_id: int | None = None):
        self.engine, self.loop, self.image_pad_id = engine, loop, image_pad_id
        self.tasks: dict[str, asyncio.Task] = {}

    def submit(self, rid: str, prompt: list[int], params: dict[str, Any], lora_path: str | None = None) -> None:
        """Queue request ``rid`` (generated with the LoRA adapter named ``lora_path``, if any); a duplicate id in
        flight raises."""
        if rid in self.tasks:
            raise ValueError(f"sglang: request id {rid!r} is already in flight; ids must be unique")
        extra: dict[str, Any] = {"lora_path": lora_path} if lora_path else {}
        ids = list(prompt)
        if prompt_images(prompt):  # SGLang expands each image's one pad token itself, from the images
            extra["image_data"] = pil_images(prompt_images(prompt))
            ids = collapse_image_pads(ids, self.image_pad())
        coro = self.engine.async_generate(input_ids=ids, sampling_params=params, return_logprob=True, rid=rid, **extra)
        self.tasks[rid] = self.loop.create_task(coro)

    def image_pad(self) -> int:
        """The model's ``<|image_pad|>`` id; a ValueError for a model without image tokens."""
        if self.image_pad_id is None:
            raise ValueError("sglang: a prompt with images for a model without image tokens (not a VL model)")
        return self.image_pad_id

    def poll(self, rids: Iterable[str] | None = None, timeout: float | None = None) -> dict[str, GenerationOutput]:
        """Finished requests among ``rids`` (default: all in flight); waits up to ``timeout`` s (None = until one)."""
        wanted = {r: self.tasks[r] for r in (self.tasks if rids is None else rids) if r in self.tasks}
        if not wanted:
            return {}
        if not any(t.done() for t in wanted.values()):
            self.loop.run_until_complete(
                asyncio.wait(wanted.values(), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            )
        done: dict[str, GenerationOutput] = {}
        for rid, task in wanted.items():
            if task.done():
                del self.tasks[rid]
                done[rid] = GenerationOutput([], [], "abort") if task.cancelled() else parse_output(task.result())
        return done

    def wait_all(self, rids: list[str]) -> dict[str, GenerationOutput]:
        """Poll until every one of ``rids`` is finished."""
        done: dict[str, GenerationOutput] = {}
        while len(done) < len(rids):
            done.update(self.poll([r for r in rids if r not in done]))
        return done

    def abort(self, rids: Iterable[str] | None = None) -> list[str]:
        """Abort requests in flight (default: all); returns the aborted ids. Their tasks are cancelled."""
        aborted = []
        for rid in list(self.tasks if rids is None else rids):
            task = self.tasks.pop(rid, None)
            if task is None:
                continue
            self.engine.tokenizer_manager.abort_request(rid=rid)
            task.cancel()
            aborted.append(rid)
        if aborted:  # let the cancellations run so no task is left pending on the loop
            self.loop.run_until_complete(asyncio.sleep(0))
        return aborted

    def __len__(self) -> int:
        return len(self.tasks)


class SGLangStrategy(InferenceStrategy):
    """``sglang.Engine`` in this process; requests tracked by :class:`RequestTracker`.

    Registered abilities (:mod:`roll.strategies.registry`): ``submit`` (:meth:`submit` / :meth:`poll` /
    :meth:`abort`), ``weight_group`` (:meth:`init_weight_group`, then :meth:`update_weights_distributed` every
    sync), ``ipc_weights`` (:meth:`load_weight_bucket`)."""

    options: SGLangOptions

    @staticmethod
    def weight_group_ranks(config: Any, options: SGLangOptions) -> int:
        """Ranks one worker of block ``config`` holds in a weight group: its engine's TP size."""
        return engine_tp_size(config, options)

    def initialize(self, ctx: StrategyContext) -> None:
        try:
            import sglang
        except ImportError as exc:
            raise ImportError(
                f"strategy 'sglang' needs SGLang (GPU only): {exc}. Install roll[gpu] on a GPU "
                f"machine, or use strategy_name: hf_infer"
            ) from exc
        options = self.options
        margs = self.config.model_args
        self.bucket_bytes = options.weight_bucket_bytes
        self.model_path = margs.model_name_or_path
        kwargs = engine_kwargs(
            self.model_path,
            margs.dtype,
            options,
            ctx.seed + 7919 * self.rank,
            tp_size=engine_tp_size(self.config, options),
        )
        if options.max_running_requests is None and ctx.max_running_requests is not None:
            kwargs["max_running_requests"] = ctx.max_running_requests
        if ctx.async_rollouts and "disable_radix_cache" not in options.engine_args:
            kwargs["disable_radix_cache"] = True  # updates in flight cannot flush it (module docstring)
        self.lora = lora_settings(margs, "actor_infer.model_args")
        if self.lora is not None:
            kwargs.update({**lora_engine_args(self.lora), **options.engine_args})
        self.release_tags = options.released(self.lora is not None)
        self.adapter_name: str | None = None  # the LoRA adapter requests are generated with (None: the base)
        self._adapter_version = 0
        self._pending_adapter: tuple[list[tuple[str, torch.Tensor]], dict[str, Any]] | None = None
        self._unloading: list[Any] = []  # unloads of older adapters, waiting for their last requests
        from transformers import AutoConfig

        hf = AutoConfig.from_pretrained(self.model_path, trust_remote_code=margs.trust_remote_code)
        text = hf.get_text_config()
        eos = getattr(text, "eos_token_id", None)
        self.eos_token_id = eos if isinstance(eos, int) else None
        #: tied embeddings: SGLang has no lm_head parameter to receive
        tied = getattr(hf, "tie_word_embeddings", False) or getattr(text, "tie_word_embeddings", False)
        self.skip_names = frozenset({"lm_head.weight"} if tied else set())
        #: a VL model: SGLang loads weights under their checkpoint names (roll.models.vision.checkpoint_name)
        self.rename = checkpoint_name if is_vision_config(hf) else None
        if self.rename and self.lora is not None:
            raise ValueError(
                "sglang: LoRA adapters of a vision-language model are not served (their peft names are not SGLang's "
                "checkpoint names; unverified): train full weights, or use actor_infer strategy_name: hf_infer"
            )
        self.engine = sglang.Engine(**kwargs)
        self.tracker = RequestTracker(self.engine, self.engine.loop, getattr(hf, "image_token_id", None))
        self.released = False
        self._weights_released = False  # the release freed the engine's weights
        self._weights_fresh = True  # weights loaded since the last release
        self._synced = False  # weights ever arrived by a CUDA-IPC sync
        self._host_weights: list[tuple[str, torch.Tensor]] | None = None
        self.last_sync: dict[str, float] = {}

    # ------------------------------------------------------------------ requests
    def submit(
        self, requests: list[tuple[str, list[int]]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> list[str]:
        """Queue ``(rid, prompt ids)`` requests; returns the SGLang ids (``rid#k`` for each of ``n`` samples)."""
        params = sampling_params(args, max_new_tokens, self.eos_token_id)
        n = max(1, args.num_return_sequences)
        sent = []
        for rid, prompt in requests:
            for k in range(n):
                sub = rid if n == 1 else f"{rid}{SAMPLE_SEP}{k}"
                self.tracker.submit(sub, prompt, params, self.adapter_name)
                sent.append(sub)
        return sent

    def poll(self, rids: list[str] | None = None, timeout: float | None = 0.05) -> dict[str, GenerationOutput]:
        """Finished requests among ``rids``, waiting at most ``timeout`` s for the first one."""
        return self.tracker.poll(rids, timeout)

    def abort(self, rids: list[str] | None = None) -> list[str]:
        """Abort requests in flight (``None``: all of them)."""
        return self.tracker.abort(rids)

    def generate(
        self, prompts: list[list[int]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> list[GenerationOutput]:
        base = f"gen-{time.monotonic_ns()}"
        rids = self.submit([(f"{base}-{i}", p) for i, p in enumerate(prompts)], args, max_new_tokens)
        done = self.tracker.wait_all(rids)
        return [done[r] for r in rids]

    # ------------------------------------------------------------------ log-probs
    def compute_log_probs(self, batch: Batch, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        """Prefill log-probs of ``input_ids[:, 1:]`` from SGLang: (B, L-1); padding positions are 0."""
        if with_entropy:
            raise ValueError("sglang: compute_log_probs has no entropy; compute it with the training strategy")
        ids, mask = batch["input_ids"], batch["attention_mask"]
        prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
        extra: dict[str, Any] = {"lora_path": [self.adapter_name] * len(prompts)} if self.adapter_name else {}
        if "images" in batch and any(batch["images"]):  # each image's pads cut to one: SGLang expands them again
            extra["image_data"] = [pil_images(images) or None for images in batch["images"]]
            pad = self.tracker.image_pad()
            prompts = [collapse_image_pads(p, pad) if im else p for p, im in zip(prompts, batch["images"])]
        outs = self.engine.generate(
            input_ids=prompts,
            sampling_params={"max_new_tokens": 1, "temperature": 0.0},
            return_logprob=True,
            logprob_start_len=0,
            **extra,
        )
        out = torch.zeros(ids.shape[0], ids.shape[1] - 1)
        for i, (o, m) in enumerate(zip(outs, mask)):
            lps = [x[0] for x in o["meta_info"]["input_token_logprobs"]][1:]  # the first token has no log-prob
            pos = m.bool().nonzero().flatten()[1:] - 1  # log-prob index t predicts token t + 1
            if len(lps) != len(pos):
                raise RuntimeError(
                    f"sglang: {len(lps) + 1} prompt tokens scored for a sample of {len(pos) + 1} (its images "
                    "expanded to another number of image tokens than roll's image processor gives?)"
                )
            out[i, pos] = torch.tensor(lps, dtype=out.dtype)
        return {"log_probs": out}

    # ------------------------------------------------------------------ weights and memory
    @contextlib.contextmanager
    def paused(self):
        """Requests in flight are retracted (kept, with their tokens) for the duration; nothing is aborted. Yields
        whether any were in flight: then the update must not flush the cache (SGLang refuses while they wait)."""
        if not len(self.tracker):
            yield False
            return
        from sglang.srt.managers.io_struct import ContinueGenerationReqInput, PauseGenerationReqInput

        manager = self.engine.tokenizer_manager
        try:
            pause = PauseGenerationReqInput(mode="retract")
        except TypeError as exc:  # sglang <= 0.5.5: pause_generation has no mode and would abort
            raise RuntimeError(
                f"sglang: this SGLang has no pause_generation(mode='retract') ({exc}); a weight "
                f"update with requests in flight would abort them: install roll[gpu]'s sglang (>= 0.5.16), or "
                f"set async_generation_ratio: 0"
            ) from exc
        self.engine.loop.run_until_complete(manager.pause_generation(pause))
        try:
            yield True
        finally:
            self.engine.loop.run_until_complete(manager.continue_generation(ContinueGenerationReqInput()))

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Push weights in buckets; while released, keep them on the host until :meth:`reload_states`."""
        named = [(n, t) for n, t in named_tensors if n not in self.skip_names]
        self._host_weights = [(n, t.detach().cpu()) for n, t in named]  # pushed again after each resume
        if not self.released:
            with self.paused() as in_flight:
                self._push(self._host_weights, flush=not in_flight)

    def load_adapter(self, named_tensors: Iterable[tuple[str, torch.Tensor]], config: dict[str, Any]) -> None:
        """Serve a LoRA adapter (peft's state-dict names and config: a trainer's ``adapter_weights`` /
        ``adapter_config``) from memory with ``load_lora_adapter_from_tensors``, under a new name per sync; requests
        submitted from now on use it, requests in flight finish with the adapter they started with (their policy
        version), and the previous adapter is unloaded once they are done. While released (colocated training
        phase), the adapter waits on the host until :meth:`reload_states`."""
        if self.lora is None:
            raise RuntimeError(
                "sglang: load_adapter needs an engine started with LoRA (actor_infer.model_args.lora_target, "
                "set from actor_train's by the launch)"
            )
        adapter = ([(n, t.detach().cpu()) for n, t in named_tensors], dict(config))
        if self.released:
            self._pending_adapter = adapter
        else:
            self._serve_adapter(*adapter)

    def _serve_adapter(self, tensors: list[tuple[str, torch.Tensor]], config: dict[str, Any]) -> None:
        start = time.perf_counter()
        self._adapter_version += 1
        name = f"roll-policy-{self._adapter_version}"
        _check_result(
            "load_lora_adapter_from_tensors",
            self.engine.load_lora_adapter_from_tensors(name, dict(tensors), config),
        )
        old, self.adapter_name, self._pending_adapter = self.adapter_name, name, None
        if old is not None:
            from sglang.srt.managers.io_struct import UnloadLoRAAdapterReqInput

            # SGLang unloads once the adapter's last request is done: a task on the engine's loop, driven by polls
            unload = self.engine.tokenizer_manager.unload_lora_adapter(UnloadLoRAAdapterReqInput(lora_name=old), None)
            self._unloading = [t for t in self._unloading if not t.done()] + [self.engine.loop.create_task(unload)]
            if not len(self.tracker):
                self.engine.loop.run_until_complete(asyncio.gather(*self._unloading))
        self.last_sync = {"sync/push_s": time.perf_counter() - start, "sync/buckets": 1.0}

    def _push(self, named: list[tuple[str, torch.Tensor]], flush: bool = True) -> None:
        start, buckets = time.perf_counter(), list(iter_buckets(named, self.bucket_bytes))
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        for i, bucket in enumerate(buckets):
            bucket = [(n, t.to(device, non_blocking=True)) for n, t in bucket] if device else bucket
            bucket = [(self.rename(n), t) for n, t in bucket] if self.rename else bucket
            self.engine.update_weights_from_tensor(named_tensors=bucket, flush_cache=flush and i == len(buckets) - 1)
        self.last_sync = {"sync/push_s": time.perf_counter() - start, "sync/buckets": float(len(buckets))}

    def load_weight_bucket(self, payloads: list[bytes], flush: bool) -> None:
        """Load one CUDA-IPC bucket (:mod:`roll.weights.ipc`; one payload per TP rank, each from the
        trainer rank on that rank's GPU) with SGLang's ``flattened_bucket`` format: no host copy. While released,
        the engine's weight memory is resumed first (its KV cache stays released until :meth:`reload_states`)."""
        tp = engine_tp_size(self.config, self.options)
        if len(payloads) != tp:
            raise ValueError(
                f"sglang: {len(payloads)} IPC payloads for an engine of TP size {tp}; one per TP rank is needed"
            )
        if self.released and self._weights_released:
            self.engine.resume_memory_occupation(tags=["weights"])
            self._weights_released = False
        if self.rename:
            payloads = [rename_payload(p, self.rename) for p in payloads]
        with self.paused() as in_flight:
            _check_result(
                "update_weights_from_tensor",
                self.engine.update_weights_from_tensor(
                    named_tensors=list(payloads), load_format="flattened_bucket", flush_cache=flush and not in_flight
                ),
            )
        self._host_weights = None  # the engine holds the newest weights; no host copy is kept
        self._weights_fresh = self._synced = True

    def offload_states(self) -> None:
        """``release_memory_occupation`` (colocated training phase); in-flight requests are aborted first."""
        if not self.released:
            self.tracker.abort()
            self.engine.release_memory_occupation(tags=self.release_tags)
            self.released = True
            self._weights_released = self.release_tags is None or "weights" in self.release_tags
            self._weights_fresh = False

    def reload_states(self) -> None:
        """``resume_memory_occupation`` of what is still released. Weights released by :meth:`offload_states` must
        have been reloaded meanwhile (a CUDA-IPC or NCCL sync), or are pushed from the host copy of a copy sync."""
        if not self.released:
            return
        tags = self.release_tags if self.release_tags is not None else ["weights", "kv_cache", "cuda_graph"]
        if not self._weights_released:
            tags = [t for t in tags if t != "weights"]
        if tags:
            self.engine.resume_memory_occupation(tags=tags)
        self.released = False
        if self._pending_adapter is not None:
            self._serve_adapter(*self._pending_adapter)
        if self._weights_released and not self._weights_fresh:
            if self._host_weights is not None:
                self._push(self._host_weights)
            elif not self._synced:
                self.engine.update_weights_from_disk(self.model_path)  # nothing trained yet: the initial weights
            else:
                raise RuntimeError(
                    "sglang: the engine's weights were released and no weight sync reloaded them "
                    "before generation; sync after every phase that releases the engine"
                )
        self._weights_released = False

    def init_weight_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = "roll_weights",
        backend: str = "nccl",
    ) -> None:
        """Join the trainer's weight group (disaggregated): the trainer is rank 0, this engine's TP ranks are
        ``rank_offset .. rank_offset + tp_size - 1``. Blocks until every member has joined."""
        _check_result(
            "init_weights_update_group",
            self.engine.init_weights_update_group(
                master_address=master_address,
                master_port=master_port,
                rank_offset=rank_offset,
                world_size=world_size,
                group_name=group_name,
                backend=backend,
            ),
        )

    def update_weights_distributed(self, metas: list[dict[str, Any]], group_name: str = "roll_weights") -> float:
        """Receive buckets (``BucketMeta`` fields as dicts) that the trainer broadcasts in the same order; only the
        last flushes the cache. Returns seconds."""
        start = time.perf_counter()
        with self.paused() as in_flight:
            for i, meta in enumerate(metas):
                _check_result(
                    "update_weights_from_distributed",
                    self.engine.update_weights_from_distributed(
                        names=[self.rename(n) for n in meta["names"]] if self.rename else meta["names"],
                        dtypes=meta["dtypes"],
                        shapes=meta["shapes"],
                        group_name=group_name,
                        flush_cache=not in_flight and i == len(metas) - 1,
                    ),
                )
        return time.perf_counter() - start

    def shutdown(self) -> None:
        """Abort everything in flight and stop the engine's processes."""
        self.tracker.abort()
        self.engine.shutdown()


def _check_result(call: str, result: Any) -> None:
    """SGLang's control calls answer ``(success, message)`` or an output object with ``success`` and
    ``error_message``; a failure raises with SGLang's message."""
    if isinstance(result, (tuple, list)) and len(result) >= 2 and not result[0]:
        raise RuntimeError(f"sglang: {call} failed: {result[1]}")
    if getattr(result, "success", True) is False:
        raise RuntimeError(f"sglang: {call} failed: {getattr(result, 'error_message', result)}")


#: Adapters an engine holds at once: the current one and the one its last requests still use.
LORA_SLOTS = 2


def lora_engine_args(lora: LoraSettings) -> dict[str, Any]:
    """``sglang.Engine`` arguments that let it serve adapters of ``lora`` loaded at run time: LoRA on, the rank, the
    target modules (``all`` for all-linear; a regular expression target cannot be served).

    >>> lora_engine_args(LoraSettings(rank=16, alpha=32.0, dropout=0.0, target=("q_proj", "v_proj")))
    {'enable_lora': True, 'max_lora_rank': 16, 'lora_target_modules': ['q_proj', 'v_proj'], 'max_loras_per_batch': 2}
    """
    if lora.names is None and lora.target != ALL_LINEAR:
        raise ValueError(
            f"sglang: lora_target={lora.target!r} is a regular expression; SGLang serves adapters on named modules: "
            f"write the module names or {ALL_LINEAR}"
        )
    modules = ["all"] if lora.names is None else list(lora.names)
    return {
        "enable_lora": True,
        "max_lora_rank": lora.rank,
        "lora_target_modules": modules,
        "max_loras_per_batch": LORA_SLOTS,
    }


__all__ = ["SGLangStrategy", "RequestTracker", "engine_kwargs", "sampling_params", "parse_output", "bucket_meta"]
