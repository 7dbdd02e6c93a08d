"""One module per `dflash-train` subcommand, each exposing `configure(parser)` and
`run(args) -> int`. Modules import torch only inside `run`, so control-plane commands
answer quickly over SSH and `--help` never loads a model stack."""
