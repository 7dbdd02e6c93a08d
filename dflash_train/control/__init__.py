"""The box's control plane: launch, stop, inspect and tail runs in a run directory.

Nothing here imports torch: these answer over SSH and must reply in well under a second.
"""
