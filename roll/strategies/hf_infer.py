"""``hf_infer``: generation and log-probs with Hugging Face transformers (CPU or one GPU).

strategy_config keys: ``generate_batch_size`` (prompts per ``generate`` call, default 64).
"""

from __future__ import annotations

from typing import Iterable

import torch

from roll.config.worker import GeneratingArgs
from roll.data.batch import Batch
from roll.models.loading import load_causal_lm, load_tokenizer, sequence_log_probs
from roll.strategies.base import GenerationOutput, InferenceStrategy, StrategyContext


class HFInferStrategy(InferenceStrategy):
    """transformers ``generate`` over left-padded batches; token ids in, token ids out."""

    KNOWN_KEYS = {"generate_batch_size"}

    def initialize(self, ctx: StrategyContext) -> None:
        unknown = set(self.config.strategy_args.strategy_config) - self.KNOWN_KEYS
        if unknown:
            raise ValueError(f"hf_infer: unknown strategy_config keys {sorted(unknown)}; "
                             f"known: {sorted(self.KNOWN_KEYS)}")
        margs = self.config.model_args
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = load_causal_lm(margs.model_name_or_path, margs.dtype, margs.attn_implementation,
                                    margs.trust_remote_code).to(self.device).eval()
        self.tokenizer = load_tokenizer(margs.model_name_or_path)
        self.generate_batch_size = int(self.config.strategy_args.strategy_config.get("generate_batch_size", 64))
        torch.manual_seed(ctx.seed + 7919 * self.rank)  # sampling draws from the global generator

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], args: GeneratingArgs,
                 max_new_tokens: int | None = None) -> list[GenerationOutput]:
        outputs: list[GenerationOutput] = []
        for start in range(0, len(prompts), self.generate_batch_size):
            outputs += self._generate_chunk(prompts[start:start + self.generate_batch_size], args,
                                            max_new_tokens or args.max_new_tokens)
        return outputs

    def _generate_chunk(self, prompts: list[list[int]], args: GeneratingArgs,
                        max_new_tokens: int) -> list[GenerationOutput]:
        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for i, p in enumerate(prompts):  # left padding: the new tokens line up at the right edge
            input_ids[i, width - len(p):] = torch.tensor(p)
            attention_mask[i, width - len(p):] = 1
        stop_ids = [self.tokenizer.eos_token_id, *args.stop_token_ids]
        sample = args.do_sample and args.temperature > 0
        out = self.model.generate(
            input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device),
            max_new_tokens=max_new_tokens, do_sample=sample,
            temperature=args.temperature if sample else None, top_p=args.top_p if sample else None,
            top_k=args.top_k if sample and args.top_k > 0 else None,
            repetition_penalty=args.repetition_penalty, eos_token_id=stop_ids, pad_token_id=pad,
            return_dict_in_generate=True, output_scores=True,
        )
        new = out.sequences[:, width:].cpu()  # (B, N)
        # log-probs of the sampled tokens under the distribution actually sampled from (after warpers)
        logps = self.model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True).cpu()
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
        return results

    @torch.no_grad()
    def compute_log_probs(self, batch: Batch, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        parts, ents = [], []
        for mb in batch.split(self.config.infer_batch_size):
            lp, ent = sequence_log_probs(self.model, mb["input_ids"].to(self.device),
                                         mb["attention_mask"].to(self.device), with_entropy)
            parts.append(lp.cpu())
            if ent is not None:
                ents.append(ent.cpu())
        out = {"log_probs": torch.cat(parts)}
        if with_entropy:
            out["entropy"] = torch.cat(ents)
        return out

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.model.named_parameters())
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"hf_infer.load_weights: no parameter {name!r} in the model")
            params[name].copy_(tensor.to(params[name].device, params[name].dtype))

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
