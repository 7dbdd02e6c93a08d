"""dflash_train: trains DFlash drafters and is the GPU box's control plane."""

__version__ = "0.1.0"
# The name pip knows both packages by (pyproject.toml; `--version` of both programs says it).
DISTRIBUTION = "dflash-train-console"
