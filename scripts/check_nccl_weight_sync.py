"""GPU check of the disaggregated weight sync without the pipeline (needs 2 GPUs and SGLang).

``python scripts/check_nccl_weight_sync.py MODEL_DIR OUT_DIR``: an ``sglang.Engine`` on GPU 1 (roll's engine
arguments, ``base_gpu_id=1``) joins a weight group whose rank 0 is this process on GPU 0
(:class:`roll.weights.group.WeightGroup`, NCCL). The Hugging Face model on GPU 0 gets noise added to
every weight; its buckets (:func:`plan_bucket_metas`, 256 MiB) are broadcast from a sender thread while the engine
receives them with ``update_weights_from_distributed`` (the calls ``SGLangStrategy.update_weights_distributed``
makes), twice. Then SGLang's prefill log-probs of random tokens are compared with the model's own: equal within
bf16 noise after the sync, far apart before it. Writes ``OUT_DIR/nccl_check.json``; exits 1 when a check fails.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

GROUP = "roll_weights"
BUCKET_BYTES = 256 * 2**20
#: mean |log-prob difference| allowed between SGLang and the trainer model on the same weights. bf16 noise: measured
#: 0.0098 on the initial random weights and 0.027 on the perturbed ones (H200, 2026-11-21), against 0.88 when stale.
MAX_MISMATCH = 0.05


def engine_log_probs(engine, ids: torch.Tensor) -> torch.Tensor:
    """(B, L-1) SGLang prefill log-probs of ``ids[:, 1:]``."""
    outs = engine.generate(
        input_ids=ids.tolist(),
        sampling_params={"max_new_tokens": 1, "temperature": 0.0},
        return_logprob=True,
        logprob_start_len=0,
    )
    return torch.tensor([[x[0] for x in o["meta_info"]["input_token_logprobs"]][1:] for o in outs])


@torch.no_grad()
def model_log_probs(model, ids: torch.Tensor) -> torch.Tensor:
    """(B, L-1) log-probs of ``ids[:, 1:]`` from the Hugging Face model (fp32 softmax)."""
    logits = model(ids.cuda()).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None].cuda()).squeeze(-1).cpu()


def send_all(group, named: dict[str, torch.Tensor], metas) -> float:
    """Sender thread: broadcast every bucket in plan order; returns seconds."""
    torch.cuda.set_device(0)
    start = time.perf_counter()
    for meta in metas:
        group.send_bucket([(n, named[n]) for n in meta.names])
    return time.perf_counter() - start


def host_group(port: int, world_size: int):
    """Sender thread: rank 0 of the weight group on GPU 0 (returns when the engine has joined)."""
    from roll.weights.group import WeightGroup

    torch.cuda.set_device(0)
    return WeightGroup("127.0.0.1", port, 0, world_size, GROUP, backend="nccl", timeout_s=300)


def receive_all(engine, metas) -> float:
    """Engine side, on the main thread: one ``update_weights_from_distributed`` per bucket; returns seconds."""
    start = time.perf_counter()
    for i, meta in enumerate(metas):
        ok, message = engine.update_weights_from_distributed(
            names=meta.names, dtypes=meta.dtypes, shapes=meta.shapes, group_name=GROUP, flush_cache=i == len(metas) - 1
        )
        if not ok:
            raise RuntimeError(f"update_weights_from_distributed failed: {message}")
    return time.perf_counter() - start


def main(model_path: str, out_dir: Path) -> int:
    import sglang
    from transformers import AutoModelForCausalLM

    from roll.config.strategies import SGLangOptions
    from roll.distributed.group import free_port
    from roll.strategies.sglang import engine_kwargs
    from roll.weights.buckets import plan_bucket_metas

    result: dict = {"nccl": torch.cuda.nccl.version(), "gpus": [torch.cuda.get_device_name(i) for i in range(2)]}
    start = time.perf_counter()
    engine = sglang.Engine(
        **engine_kwargs(model_path, "bf16", SGLangOptions(engine_args={"base_gpu_id": 1}, mem_fraction_static=0.4), 0)
    )
    result["engine_start_s"] = time.perf_counter() - start
    torch.cuda.set_device(0)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16).cuda().eval()
    ids = torch.randint(0, 1000, (4, 64), generator=torch.Generator().manual_seed(0))
    engine_before, model_before = engine_log_probs(engine, ids), model_log_probs(model, ids)
    gen = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32).to(p.dtype) * 0.02)
    model_after = model_log_probs(model, ids)
    named = {n: p.data for n, p in model.named_parameters()}
    metas = plan_bucket_metas([(n, t.shape, t.dtype) for n, t in named.items()], BUCKET_BYTES)
    result.update(buckets=len(metas), gib=sum(m.nbytes for m in metas) / 2**30, tensors=len(named))
    port = free_port()
    with ThreadPoolExecutor(1) as pool:
        hosting = pool.submit(host_group, port, 2)
        start = time.perf_counter()
        ok, message = engine.init_weights_update_group(
            master_address="127.0.0.1", master_port=port, rank_offset=1, world_size=2, group_name=GROUP, backend="nccl"
        )
        group = hosting.result(timeout=300)
        result.update(group_ok=bool(ok), group_message=message, group_setup_s=time.perf_counter() - start)
        result["syncs"] = []
        for _ in range(2):
            sending = pool.submit(send_all, group, named, metas)
            recv_s = receive_all(engine, metas)
            result["syncs"].append({"send_s": sending.result(timeout=300), "receive_s": recv_s})
    engine_after = engine_log_probs(engine, ids)
    result.update(
        initial_mismatch=float((engine_before - model_before).abs().mean()),
        after_sync_mismatch=float((engine_after - model_after).abs().mean()),
        after_sync_mismatch_max=float((engine_after - model_after).abs().max()),
        stale_mismatch=float((engine_before - model_after).abs().mean()),
    )
    result["checks"] = {
        "group joined": result["group_ok"],
        f"engine == trainer after sync (mean < {MAX_MISMATCH})": result["after_sync_mismatch"] < MAX_MISMATCH,
        "the sync changed the engine (stale > 10 x after)": result["stale_mismatch"]
        > 10 * result["after_sync_mismatch"],
    }
    result["passed"] = all(result["checks"].values())
    group.close()
    engine.shutdown()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "nccl_check.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1), flush=True)
    return 0 if result["passed"] else 1


if __name__ == "__main__":  # SGLang starts its processes with spawn
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
