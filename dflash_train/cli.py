"""`dflash-train`: the trainer and the box's control plane in one command."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from dflash_train import DISTRIBUTION, __version__, protocol

# The extra that brings each module, by import name: a command that needs a missing one
# says which extra to install (pyproject.toml's optional-dependencies). gguf is [demo]'s:
# only the `smollm2` target reads a GGUF file.
EXTRA_OF_MODULE = dict.fromkeys(
    {"torch", "transformers", "accelerate", "datasets", "numpy", "safetensors", "pynvml"}
    | {"wandb", "tqdm", "matplotlib", "pyarrow"},
    "train",
) | {"gguf": "demo"}

# name -> (module under dflash_train.commands, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "prepare": ("prepare", "have the target answer prompts and write a tokenized dataset"),
    "train": ("train", "train a DFlash drafter (runs in the foreground)"),
    "export": ("export", "export a run or checkpoint in the z-lab DFlash layout"),
    "eval": ("evaluate", "real speculative decoding with a drafter: tau, lossless check"),
    "launch": ("launch", "start a detached, verified training run in RUN_DIR"),
    "stop": ("stop", "SIGTERM the run's process group, SIGKILL after a timeout"),
    "restart": ("restart", "stop, then launch again resuming from the newest checkpoint"),
    "status": ("status", "running / finished / crashed / stalled, as JSON"),
    "tail": ("tail", "the status stream from a cursor, optionally following"),
    "logs": ("logs", "the run's train.log, optionally following (survives rotation)"),
    "gpus": ("gpus", "NVML readings of this box's GPUs"),
    "set": ("set_setting", "change a live setting of a running trainer"),
    "schema": ("schema", "JSON Schema of the status stream's lines and of the replies"),
    "plan": ("plan", "the best targets:drafters split of N GPUs, from a run's stage rates"),
    "report": ("report", "one self-contained HTML report of a run, from its stream (--png)"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole CLI, or with `only` just that subcommand: importing every command's
    module (prepare's and train's pull in the data and config stacks) cost each `tail` and
    `status` the console runs about 0.3 s."""
    parser = argparse.ArgumentParser(
        prog="dflash-train",
        description="Train DFlash drafters and control training runs. Control commands "
        "print one JSON reply on stdout.",
    )
    parser.add_argument(
        "--version", action="version", version=f"dflash-train {__version__} ({DISTRIBUTION})"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        if only is not None and name != only:
            continue
        module = importlib.import_module(f"dflash_train.commands.{module_name}")
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.configure(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    only = words[0] if words and words[0] in SUBCOMMANDS else None
    if words == ["--version"]:
        only = ""  # no command module to import for the version
    try:
        args = build_parser(only).parse_args(words)
        return int(args._module.run(args) or 0)
    except ModuleNotFoundError as exc:
        extra = EXTRA_OF_MODULE.get((exc.name or "").split(".")[0])
        if extra is None:
            raise
        # Installed without the extra (the [train] one on a console's laptop, say): one reply
        # that says what to install, not a traceback from deep inside an import.
        command = words[0] if words and words[0] in SUBCOMMANDS else "dflash-train"
        why = (
            f"{exc.name} is not installed: dflash-train {command} needs the [{extra}] extra "
            f"(pip install '{DISTRIBUTION}[{extra}]')"
        )
        from dflash_train.control.reply_text import with_message

        reply = protocol.reply_error(command, "missing_dependency", why)
        print(with_message(reply).to_json(), flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
