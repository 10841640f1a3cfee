"""The one error type of bad configuration: it names the key, the bad value and what is allowed."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A configuration value that cannot run.

    Args:
        key: dotted path of the offending key (``actor_train.training_args.learning_rate``).
        value: the value found.
        expected: what is allowed, and the fix when it is not obvious.
    """

    def __init__(self, key: str, value: Any, expected: str):
        self.key, self.value, self.expected = key, value, expected
        super().__init__(f"{key}={value!r}: {expected}")
