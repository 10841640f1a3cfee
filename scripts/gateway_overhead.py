"""The gateway's overhead per request against the generation time: 16 concurrent openai-client harnesses (the
tests' tool-calling one) play 4 turns each against the tiny model (hf_infer, in process, CPU).

Per request: ``latency`` (the client's wall time), ``engine`` (time the request spent in the generation loop:
batching wait + generation), ``overhead = latency - engine`` (HTTP, JSON, rendering, tokenizing, parsing,
recording). Prints median and p99 of each. Usage: ``python scripts/gateway_overhead.py [--sessions 16]
[--turns 4] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    import openai

    from roll.agentic.gateway.server import Gateway
    from roll.config.worker import GeneratingArgs, WorkerConfig
    from roll.models.loading import load_tokenizer
    from roll.models.tiny import build_tiny_model
    from roll.rollout.client import BatchClient
    from roll.strategies.base import StrategyContext
    from roll.strategies.hf_infer import HFInferStrategy
    from roll.strategies.registry import strategy_options
    from tests.agentic.gateway_harness import TOOLS, first_messages
    from tests.agentic.gateway_parts import TOOLS_TEMPLATE, StrategyBatches, model_dir_with_template

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    model = model_dir_with_template(str(build_tiny_model(tmp / "tiny")), tmp / "tools", TOOLS_TEMPLATE)
    config = WorkerConfig()
    config.model_args.model_name_or_path = model
    config.strategy_args.strategy_name = "hf_infer"
    strategy = HFInferStrategy(config, 0, 1, options=strategy_options(config))
    strategy.initialize(StrategyContext(seed=0))
    gateway = Gateway(load_tokenizer(model), GeneratingArgs(max_new_tokens=args.max_tokens), 2048)
    gateway.start()
    gateway.engine.use(BatchClient(StrategyBatches(strategy)))
    samples: list[tuple[float, float]] = []

    def play(seed: int) -> list[tuple[str, float]]:
        _, key = gateway.start_session(args.max_tokens)
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        messages, out = first_messages(seed), []
        for _ in range(args.turns):
            start = time.perf_counter()
            response = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
            out.append((response.id, time.perf_counter() - start))
            messages += [
                response.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": "Call the add tool."},
            ]
        return out

    for r in range(args.rounds):
        with ThreadPoolExecutor(args.sessions) as pool:
            for latencies in pool.map(play, range(r * args.sessions, (r + 1) * args.sessions)):
                samples += [(latency, gateway.timings[rid][1]) for rid, latency in latencies]
    gateway.stop()

    def pct(xs: list[float], q: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    overhead = [lat - eng for lat, eng in samples]
    engine = [eng for _, eng in samples]
    latency = [lat for lat, _ in samples]
    print(
        f"{len(samples)} requests ({args.sessions} sessions x {args.turns} turns x {args.rounds} rounds, "
        f"max_tokens {args.max_tokens})"
    )
    for name, xs in (("overhead", overhead), ("engine", engine), ("latency", latency)):
        print(f"{name:8s} median {statistics.median(xs) * 1000:8.1f} ms   p99 {pct(xs, 0.99) * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
