"""The shared rollout machinery: generation clients, the dynamic batcher, the asynchronous group buffer."""
