"""The training pipeline: hidden-state sources, the bounded pool between target and
drafter, the drafter step, the monitor thread and its outlets (status stream, W&B)."""
