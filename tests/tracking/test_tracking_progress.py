"""The progress bar: automatic TTY detection, step counts, metric postfix."""

from __future__ import annotations

import io

from roll.tracking.progress import progress, short_names


class FakeTerminal(io.StringIO):
    """A text stream that claims to be a terminal."""

    def isatty(self) -> bool:
        return True


def test_disabled_when_not_a_terminal() -> None:
    out = io.StringIO()
    with progress(total=5, desc="train", file=out) as bar:
        assert not bar.enabled
        bar.advance({"rollout/success_rate": 0.5})
    assert out.getvalue() == ""


def test_terminal_shows_bar_with_postfix_and_initial_step() -> None:
    out = FakeTerminal()
    with progress(total=10, desc="train", initial=2, file=out) as bar:
        assert bar.enabled
        bar.advance({"rollout/success_rate": 0.31249, "actor/pg_loss": -0.0123, "other/key": 7.0})
        bar.advance(n=2)
        assert bar.bar.n == 5
    text = out.getvalue()
    assert "train" in text and "5/10" in text
    assert "success_rate=0.3125, pg_loss=-0.0123" in text and "other" not in text


def test_forced_on_and_postfix_text() -> None:
    with progress(total=3, file=io.StringIO(), enabled=True, postfix_keys=["val/success_rate", "a/b"]) as bar:
        assert bar.postfix({"a/b": 2.0, "val/success_rate": 0.5, "c/d": 1.0}) == "success_rate=0.5, b=2"


def test_short_names_keep_full_key_on_clash() -> None:
    assert short_names(["rollout/success_rate", "val/success_rate", "actor/pg_loss"]) == {
        "rollout/success_rate": "rollout/success_rate",
        "val/success_rate": "val/success_rate",
        "actor/pg_loss": "pg_loss",
    }
