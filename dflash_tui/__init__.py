"""dflash_tui: the operator console for dflash runs (never imports torch)."""

__version__ = "0.1.0"
