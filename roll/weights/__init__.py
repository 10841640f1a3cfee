"""Weights from the trainer to the engines: the sync modes, buckets, CUDA IPC, shared memory, the weight group."""
