"""dflash_train: trains DFlash drafters and is the GPU box's control plane."""

__version__ = "0.1.0"
