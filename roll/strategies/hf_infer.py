"""``hf_infer``: generation and log-probs with Hugging Face transformers (CPU or one GPU).

``strategy_config``: :class:`~roll.config.strategies.HFInferOptions` (``generate_batch_size``, ``reuse_kv_cache``: keep
each sequence's keys and values for its next turn, see :mod:`roll.strategies.turn_cache`, ``kv_cache_mb``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from roll.config.strategies import HFInferOptions
from roll.config.worker import GeneratingArgs
from roll.data.batch import Batch
from roll.data.trajectory import prompt_images
from roll.models.decode import cache_arg, decode, output_cache
from roll.models.decode import unsupported as decode_unsupported
from roll.models.loading import load_causal_lm, load_tokenizer
from roll.models.logprobs import token_log_probs
from roll.models.lora import is_peft, load_adapter
from roll.models.vision import ImageInputs, is_vision_model, vision_kwargs
from roll.strategies.base import GenerationOutput, InferenceStrategy, ScoringStrategy, StrategyContext
from roll.strategies.turn_cache import TurnCache, batch_cache, batch_layout, split_cache


class HFInferStrategy(InferenceStrategy, ScoringStrategy):
    """Left-padded batches, token ids in, token ids out. On CPU a Llama-family model decodes with
    :func:`roll.models.decode.decode` (``generate``'s tokens and log-probs bit for bit, in 0.69-0.95x of its time);
    any other model, a repetition penalty, or a GPU uses transformers ``generate``. Registered ability
    ``ipc_weights``: weights may arrive as CUDA-IPC buckets from a trainer on the same GPU
    (:meth:`load_weight_bucket`)."""

    options: HFInferOptions

    def initialize(self, ctx: StrategyContext) -> None:
        options = self.options
        margs = self.config.model_args
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = (
            load_causal_lm(margs.model_name_or_path, margs.dtype, margs.attn_implementation, margs.trust_remote_code)
            .to(self.device)
            .eval()
        )
        self.tokenizer = load_tokenizer(margs.model_name_or_path)
        self.generate_batch_size = min(options.generate_batch_size, ctx.max_running_requests or 2**31)
        self.turn_cache = TurnCache(int(options.kv_cache_mb * 2**20)) if options.reuse_kv_cache else None
        torch.manual_seed(ctx.seed + 7919 * self.rank)  # sampling draws from the global generator

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], args: GeneratingArgs, max_new_tokens: int | None = None
    ) -> list[GenerationOutput]:
        outputs: list[GenerationOutput] = []
        for start in range(0, len(prompts), self.generate_batch_size):
            outputs += self._generate_chunk(
                prompts[start : start + self.generate_batch_size], args, max_new_tokens or args.max_new_tokens
            )
        return outputs

    def _generate_chunk(
        self, prompts: list[list[int]], args: GeneratingArgs, max_new_tokens: int
    ) -> list[GenerationOutput]:
        """Prompts that continue a kept sequence and those that do not go in separate calls (mixed, the new ones
        would be padded to the cached width plus their whole length)."""
        if any(prompt_images(p) for p in prompts):  # images: no kept keys (they would stand for other pixels)
            hits: list[tuple[int, Any]] = [(0, None)] * len(prompts)
        else:
            hits = [self.turn_cache.pop_prefix(p) if self.turn_cache is not None else (0, None) for p in prompts]
            if self.config.shares_prefixes():
                hits = self._prefill_shared(prompts, hits)
        results: list[GenerationOutput | None] = [None] * len(prompts)
        for part in ([i for i, h in enumerate(hits) if h[0]], [i for i, h in enumerate(hits) if not h[0]]):
            if part:
                outs = self._generate_part([prompts[i] for i in part], [hits[i] for i in part], args, max_new_tokens)
                for i, out in zip(part, outs):
                    results[i] = out
        return results

    def _prefill_shared(self, prompts: list[list[int]], hits: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
        """``hits`` with kept keys and values for the prompts (without one) that occur more than once in the batch
        (a group's samples): all but a prompt's last token are encoded once per distinct prompt, and its copies
        start from those keys (``use_prefix_sharing``)."""
        rows: dict[tuple[int, ...], list[int]] = {}
        for i, (prompt, (cached, _)) in enumerate(zip(prompts, hits)):
            if not cached and len(prompt) > 1:
                rows.setdefault(tuple(prompt), []).append(i)
        shared = [p for p, members in rows.items() if len(members) > 1]
        if not shared:
            return hits
        heads = [list(p[:-1]) for p in shared]
        input_ids, attention_mask, _ = batch_layout(heads, [0] * len(heads), self.tokenizer.pad_token_id)
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            position_ids=positions.to(self.device),
            use_cache=True,
            logits_to_keep=1,
        )
        hits = list(hits)
        for prompt, kv in zip(shared, split_cache(output_cache(out), attention_mask, [0] * len(heads))):
            for i in rows[prompt]:
                hits[i] = (len(prompt) - 1, kv)
        return hits

    def _generate_part(
        self, prompts: list[list[int]], hits: list[tuple[int, Any]], args: GeneratingArgs, max_new_tokens: int
    ) -> list[GenerationOutput]:
        pad = self.tokenizer.pad_token_id
        cached = [c for c, _ in hits]
        input_ids, attention_mask, width_cached = batch_layout(prompts, cached, pad)  # left padding
        width = input_ids.shape[1]
        extra, past = {}, None
        if width_cached:
            like = next(kv for _, kv in hits if kv is not None)
            past = batch_cache([kv for _, kv in hits], cached, width_cached, like)
            extra[cache_arg(type(self.model))] = past
        images = [im for p in prompts for im in prompt_images(p)]
        if images:
            extra.update(self._image_args(images, input_ids))
        inner = getattr(self.model, "model", None)
        if inner is not None and getattr(inner, "rope_deltas", None) is not None:
            # a VL model keeps the 3-D rotary offsets of its last call's rows (transformers' rope_deltas) and adds
            # them to the positions of a call that starts from kept keys: this batch computes its own
            inner.rope_deltas = None
        stop_ids = [self.tokenizer.eos_token_id, *args.stop_token_ids]
        sample = args.do_sample and args.temperature > 0
        if (
            self.device.type == "cpu"
            and max_new_tokens >= 1
            and decode_unsupported(self.model, args.repetition_penalty) is None
        ):
            out = decode(
                self.model,
                input_ids,
                attention_mask,
                max_new_tokens,
                past=past,
                past_width=width_cached,
                do_sample=sample,
                temperature=args.temperature if sample else 1.0,
                top_k=args.top_k if sample and args.top_k > 0 else 0,
                top_p=args.top_p if sample else 1.0,
                min_new_tokens=max_new_tokens if args.ignore_eos else 0,
                stop_ids=stop_ids,
                pad_id=pad,
                keep_cache=self.turn_cache is not None,
            )
            new, logps, cache = out.tokens, out.log_probs, out.cache  # CPU tensors
        else:
            out = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                max_new_tokens=max_new_tokens,
                do_sample=sample,
                temperature=args.temperature if sample else None,
                top_p=args.top_p if sample else None,
                # top_k 0: off (None would let the model's generation_config.top_k, 50 by default, filter the tokens)
                top_k=(args.top_k if args.top_k > 0 else 0) if sample else None,
                repetition_penalty=args.repetition_penalty,
                eos_token_id=stop_ids,
                pad_token_id=pad,
                min_new_tokens=max_new_tokens if args.ignore_eos else None,
                return_dict_in_generate=True,
                output_scores=True,
                **extra,
            )
            new = out.sequences[:, width:].cpu()  # (B, N)
            # log-probs of the sampled tokens under the distribution actually sampled from (after warpers)
            logps = self.model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True).cpu()
            cache = output_cache(out)
        results = []
        stop_set = set(stop_ids)
        for i in range(len(prompts)):
            ids, lps, reason = [], [], "length"
            for t, tok in enumerate(new[i].tolist()):
                ids.append(tok)
                lps.append(float(logps[i, t]))
                if tok in stop_set:
                    reason = "stop"
                    break
            results.append(GenerationOutput(ids, lps, reason))
        if self.turn_cache is not None and cache is not None and not images:
            # keys exist for the prompt and every response token but the last (never fed back)
            kept = [len(r.token_ids) - 1 for r in results]
            for prompt, r, kv in zip(prompts, results, split_cache(cache, attention_mask, kept)):
                self.turn_cache.store(prompt + r.token_ids[:-1], kv)
        return results

    def _image_args(self, images: list[Any], input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """``generate``'s image arguments: the images' ``pixel_values`` and ``image_grid_thw`` in prompt order, and
        ``mm_token_type_ids`` (1 on image tokens), from which the model computes its 3-D rotary positions."""
        if not is_vision_model(self.model):
            raise ValueError(
                f"hf_infer: a prompt has images but {self.config.model_args.model_name_or_path} is not a "
                "vision-language model (no vision_config); use one (e.g. Qwen2.5-VL) or an env without images"
            )
        if getattr(self, "_image_inputs", None) is None:
            self._image_inputs = ImageInputs(str(self.config.model_args.model_name_or_path), self.tokenizer)
        pixel_values, grid = self._image_inputs.encode(images)
        return {
            "pixel_values": pixel_values.to(self.device),
            "image_grid_thw": grid.to(self.device),
            "mm_token_type_ids": input_ids.eq(self._image_inputs.image_pad_id).int().to(self.device),
        }

    @torch.no_grad()
    def compute_log_probs(self, batch: Batch, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        parts, ents = [], []
        for mb in batch.split(self.config.infer_batch_size):
            vision = vision_kwargs(mb, self.device)  # images: the padded forward (no packing, no shared prefixes)
            lp, ent = token_log_probs(
                self.model,
                mb["input_ids"].to(self.device),
                mb["attention_mask"].to(self.device),
                with_entropy=with_entropy,
                pack=self.config.use_sequence_packing and not vision,
                share_prefix=self.config.shares_prefixes() and not vision,
                compiled=self.config.model_args.compile_log_probs,
                vision=vision,
            )
            parts.append(lp.cpu())
            if ent is not None:
                ents.append(ent.cpu())
        out = {"log_probs": torch.cat(parts)}
        if with_entropy:
            out["entropy"] = torch.cat(ents)
        return out

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self.turn_cache is not None:
            self.turn_cache.clear()  # keys and values of the old weights
        if is_peft(self.model):
            raise RuntimeError(
                "hf_infer.load_weights: the engine serves a LoRA adapter (load_adapter); with LoRA the base weights "
                "never change, so send the adapter (load_adapter), not full (merged) weights"
            )
        params = dict(self.model.named_parameters())
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"hf_infer.load_weights: no parameter {name!r} in the model")
            params[name].copy_(tensor.to(params[name].device, params[name].dtype))

    @torch.no_grad()
    def load_adapter(self, named_tensors: Iterable[tuple[str, torch.Tensor]], config: dict[str, Any]) -> None:
        """Serve a LoRA adapter (peft's state-dict names, a trainer's ``adapter_weights``; ``config``: its
        ``adapter_config``) on the loaded weights: the model is wrapped by peft on the first call, later calls
        replace the adapter's tensors (:func:`roll.models.lora.load_adapter`). A peft model generates with
        ``generate`` (the lean decode loop reads the base weights only)."""
        if self.turn_cache is not None:
            self.turn_cache.clear()  # keys and values of the old adapter
        self.model = load_adapter(self.model, named_tensors, config).eval()

    def load_weight_bucket(self, payloads: list[bytes], flush: bool = True) -> None:
        """Copy one CUDA-IPC bucket (:mod:`roll.weights.ipc`) into the parameters: a device-to-device
        copy on the trainer's GPU (device-to-host while offloaded)."""
        from roll.weights.ipc import open_bucket

        if len(payloads) != 1:
            raise ValueError(f"hf_infer: {len(payloads)} IPC payloads for one GPU; expected 1")
        self.load_weights(open_bucket(payloads[0]))

    def offload_states(self) -> None:
        """GPU only: move the model to CPU memory and free the CUDA cache (colocated with a trainer); weights
        loaded while offloaded land in the CPU copy. A no-op on CPU."""
        if self.device.type != "cuda" or getattr(self, "_offloaded", False):
            return
        self.model.to("cpu")
        torch.cuda.empty_cache()
        self._offloaded = True

    def reload_states(self) -> None:
        """Undo :meth:`offload_states`."""
        if getattr(self, "_offloaded", False):
            self.model.to(self.device)
            self._offloaded = False
