"""The PPO update both pipelines share: advantages, the training epochs, losses, the off-policy correction and
the signal watch."""
