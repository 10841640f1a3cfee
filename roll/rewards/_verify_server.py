"""Child process that runs math-verify comparisons for :mod:`roll.rewards.symbolic`.

Run as a script (``python _verify_server.py``), it imports only the standard library and math-verify, so it
works whatever the parent's ``sys.path`` or ``__main__`` is. Protocol, one JSON object per line:
it prints ``{"ready": true}`` once imports are done, then answers every request line
``{"pred": str, "truth": str}`` with ``{"match": bool}`` (``{"error": str}`` if math-verify raised).
math-verify's own signal-based timeouts are off: the parent kills this process when a request takes too long.
"""

import json
import logging
import sys


def _compare(pred: str, truth: str) -> bool:
    """Parse both answers with math-verify and compare them (gold first, as math-verify expects).

    Both are already-extracted answers, so each is wrapped in ``\\boxed{}``: math-verify then parses the
    whole string as one LaTeX expression (``2x`` is 2*x) instead of searching it for a number (``2``).
    """
    from math_verify import parse, verify

    gold = parse(f"\\boxed{{{truth}}}", parsing_timeout=None)
    target = parse(f"\\boxed{{{pred}}}", parsing_timeout=None)
    if not gold or not target:
        return False
    return bool(verify(gold, target, timeout_seconds=None))


def main() -> None:
    """Serve comparison requests from stdin until it closes."""
    logging.disable(logging.WARNING)  # math-verify warns on every call that its own timeout is off
    import math_verify  # noqa: F401  (import before signalling ready, so startup is not timed)

    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply = {"match": _compare(request["pred"], request["truth"])}
        except Exception as exc:  # a parser crash means "no match", reported to the parent
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
