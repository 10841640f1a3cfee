"""Weights from the trainer to the engines: the sync and its modes (:mod:`~roll.weights.sync`), the worker-side
endpoints (:mod:`~roll.weights.sender`, :mod:`~roll.weights.receiver`), buckets, CUDA IPC, shared memory, the
weight group. Nothing here imports the distributed layer or the strategies: each side is a Protocol of its own."""
