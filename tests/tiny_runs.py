"""Overrides of a tiny in-process pipeline run (a 1-layer model of width 32, local mode, nothing saved), shared by
the tests that run whole pipelines and compare their metrics."""

from __future__ import annotations

TINY_LOCAL_RUN = [
    "tiny_model.hidden_size=32",
    "tiny_model.intermediate_size=64",
    "tiny_model.num_hidden_layers=1",
    "tiny_model.vocab_size=400",
    "track_with=stdout",
    "distributed=local",
    "save_steps=0",
    "zero_signal_patience=0",
    "actor_train.num_cpus_per_worker=1",
    "actor_infer.num_cpus_per_worker=1",
]
