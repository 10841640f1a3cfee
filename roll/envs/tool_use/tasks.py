"""Computation tasks for :class:`~roll.envs.tool_use.env.ToolUseEnv`, generated from a seeded RNG.

Each task generator is registered in :data:`TASKS` with :func:`register_task` and maps a ``numpy.random.Generator`` to a
:class:`Task` (question text, exact integer answer). The numbers are chosen so that a tool makes the
task easy and mental arithmetic makes it hard.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from roll.registry import Registry


@dataclass(frozen=True)
class Task:
    """One question with its exact integer answer."""

    kind: str
    question: str
    answer: int


TaskGenerator = Callable[[np.random.Generator], Task]
#: task name -> generator.
TASKS: Registry[TaskGenerator] = Registry("tool_use task", "register_task")


def register_task(name: str) -> Callable[[TaskGenerator], TaskGenerator]:
    """Decorator: register a task generator in :data:`TASKS` under ``name``.

    Raises:
        ValueError: ``name`` is already registered.
    """
    return TASKS.register(name)


def list_tasks() -> list[str]:
    """Names of all registered task generators, sorted."""
    return TASKS.names()


def get_task_generator(name: str) -> TaskGenerator:
    """The generator registered as ``name`` (or ``"package.module:name"``, importing ``package.module`` first).

    Raises:
        UnknownNameError: unknown name (a ``ValueError``); the message lists the registered tasks.
        ImportError: the module of a ``"package.module:name"`` does not import.
    """
    return TASKS.get(name)


def _int(rng: np.random.Generator, low: int, high: int) -> int:
    """A uniform integer in ``[low, high)`` as a Python int."""
    return int(rng.integers(low, high))


@register_task("multiply")
def multiply(rng: np.random.Generator) -> Task:
    """Product of two 6-9 digit numbers."""
    a, b = _int(rng, 10**5, 10**9), _int(rng, 10**5, 10**9)
    return Task("multiply", f"What is {a} * {b}?", a * b)


@register_task("sum_of_powers")
def sum_of_powers(rng: np.random.Generator) -> Task:
    """Sum of i**k for i = 1..n, k in {2, 3}."""
    n, k = _int(rng, 100, 5000), _int(rng, 2, 4)
    return Task(
        "sum_of_powers",
        f"What is the sum of i**{k} for all integers i from 1 to {n}?",
        sum(i**k for i in range(1, n + 1)),
    )


@register_task("modpow")
def modpow(rng: np.random.Generator) -> Task:
    """Modular exponentiation a**b mod m."""
    a, b, m = _int(rng, 2, 10**6), _int(rng, 10**3, 10**9), _int(rng, 10**3, 10**6)
    return Task(
        "modpow", f"What is {a}**{b} mod {m} (the remainder of {a} to the power {b} divided by {m})?", pow(a, b, m)
    )


def _count_primes_below(n: int) -> int:
    sieve = np.ones(n, dtype=bool)
    sieve[:2] = False
    for p in range(2, math.isqrt(n - 1) + 1):
        if sieve[p]:
            sieve[p * p :: p] = False
    return int(sieve.sum())


@register_task("count_primes")
def count_primes(rng: np.random.Generator) -> Task:
    """Number of primes below N, 1000 <= N < 100000."""
    n = _int(rng, 1000, 100_000)
    return Task("count_primes", f"How many prime numbers are less than {n}?", _count_primes_below(n))


@register_task("factorial_digit_sum")
def factorial_digit_sum(rng: np.random.Generator) -> Task:
    """Sum of the decimal digits of n!, 20 <= n < 300."""
    n = _int(rng, 20, 300)
    return Task(
        "factorial_digit_sum",
        f"What is the sum of the decimal digits of {n}! ({n} factorial)?",
        sum(int(d) for d in str(math.factorial(n))),
    )


@register_task("collatz_steps")
def collatz_steps(rng: np.random.Generator) -> Task:
    """Collatz steps from n to 1 (n -> n/2 if even, 3n+1 if odd)."""
    n = start = _int(rng, 1000, 10**6)
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return Task(
        "collatz_steps",
        f"Starting from {start}, repeatedly replace n by n/2 if n is even or by 3n+1 if n "
        "is odd. How many steps does it take to reach 1?",
        steps,
    )
