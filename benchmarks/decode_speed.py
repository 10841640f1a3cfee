"""The lean decode loop (``roll.models.decode``) against transformers' ``generate`` on the same model and batches.

Each shape (sequences x prompt tokens x new tokens, every reply generated to full length) runs both paths
alternately, ``--repeats`` times each, sampling at temperature 1; reported per shape: each path's fastest and median
wall time of a whole call (prefill, decode, log-probs, as ``hf_infer`` makes it) and the ratio lean / generate of the
medians. Both paths must give the same tokens (same seed): a shape where they differ is reported as a failure.

    python benchmarks/decode_speed.py                       # roll's tiny model (built from its config)
    python benchmarks/decode_speed.py --model output/vs_trl/start --out benchmarks/results/decode_speed_cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from roll.models.decode import decode  # noqa: E402

#: (sequences, prompt tokens, new tokens): the generate calls of benchmarks/vs_trl.py's grid (8 prompts x group).
SHAPES = [(64, 24, 16), (32, 24, 8), (32, 24, 64), (64, 64, 32), (128, 128, 8), (32, 128, 64)]


def generate_call(model, ids, mask, new_tokens: int):
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=None,  # as hf_infer (None: no top-k)
        eos_token_id=[model.config.eos_token_id],
        pad_token_id=model.config.pad_token_id,
        return_dict_in_generate=True,
        output_scores=True,
    )
    model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    return out.sequences[:, ids.shape[1] :]


def lean_call(model, ids, mask, new_tokens: int):
    return decode(
        model,
        ids,
        mask,
        new_tokens,
        min_new_tokens=new_tokens,
        stop_ids=[model.config.eos_token_id],
        pad_id=model.config.pad_token_id,
        keep_cache=False,
    ).tokens


@torch.no_grad()
def run_shape(model, batch: int, prompt: int, new_tokens: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(batch + prompt + new_tokens)
    ids = torch.randint(3, model.config.vocab_size, (batch, prompt), generator=gen)
    mask = torch.ones_like(ids)
    times: dict[str, list[float]] = {"generate": [], "lean": []}
    same = True
    for _ in range(repeats + 1):  # the first round warms up and is not counted
        tokens = {}
        for name, call in (("generate", generate_call), ("lean", lean_call)):
            torch.manual_seed(0)
            start = time.perf_counter()
            tokens[name] = call(model, ids, mask, new_tokens)
            times[name].append(time.perf_counter() - start)
        same = same and torch.equal(tokens["generate"], tokens["lean"])
    row = {"sequences": batch, "prompt_tokens": prompt, "new_tokens": new_tokens, "same_tokens": same}
    for name, values in times.items():
        row[name] = {"min_s": min(values[1:]), "median_s": statistics.median(values[1:])}
    row["ratio"] = row["lean"]["median_s"] / row["generate"]["median_s"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a Hugging Face model directory (default: roll's tiny model, built here)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument(
        "--shapes",
        nargs="+",
        metavar="BxPxN",
        help="sequences x prompt x new tokens (default: " + " ".join(f"{b}x{p}x{n}" for b, p, n in SHAPES) + ")",
    )
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        path = args.model
        if path is None:
            from roll.models.tiny import build_tiny_model

            path = str(build_tiny_model(Path(tmp) / "tiny"))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    results = {
        "model": args.model or "roll tiny model (build_tiny_model defaults)",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "shapes": [],
    }
    print(f"{'sequences x prompt x new':>26} {'generate s':>11} {'lean s':>8} {'lean/generate':>14} same tokens")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes] if args.shapes else SHAPES
    for batch, prompt, new_tokens in shapes:
        row = run_shape(model, batch, prompt, new_tokens, args.repeats)
        results["shapes"].append(row)
        print(
            f"{f'{batch} x {prompt} x {new_tokens}':>26} {row['generate']['median_s']:>11.4f} "
            f"{row['lean']['median_s']:>8.4f} {row['ratio']:>14.2f} {row['same_tokens']}",
            flush=True,
        )
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0 if all(r["same_tokens"] for r in results["shapes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
