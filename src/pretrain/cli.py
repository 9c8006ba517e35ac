"""The `pretrain` command: parses arguments and dispatches; the work is done by plain Python functions.

Each subcommand lives in a module with `HELP` (one line), `add_arguments(parser)` and `run(args)`. Those
modules import torch only inside `run`, so `pretrain plan` and `pretrain --help` start instantly.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

from .errors import UsageError

COMMANDS = {
    "plan": "pretrain.plan.command",
    "config": "pretrain.config_command",
    "tokenizer": "pretrain.data.tokenizer_command",
    "prepare": "pretrain.data.prepare_command",
    "train": "pretrain.train.command",
    "bench": "pretrain.bench.command",
    "sweep": "pretrain.sweep.command",
    "report": "pretrain.report.command",
    "export": "pretrain.export.command",
    "generate": "pretrain.export.generate_command",
    "eval": "pretrain.eval.command",
    "demo": "pretrain.demo",
}


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2), like every other bad input."""

    commands: dict[str, Parser]  # set by build_parser, on the top parser only

    def error(self, message: str) -> NoReturn:  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> Parser:
    from . import __version__

    parser = Parser(prog="pretrain", description="Plan, prepare, train and measure LLM pretraining.")
    parser.add_argument("--version", action="version", version=f"pretrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    parser.commands = {}  # name -> its parser: an unknown flag is reported by the command it was given to
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(
            name, help=module.HELP, description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
        parser.commands[name] = p
    return parser


def first_to_report() -> bool:
    """Whether this process prints its error: always outside torchrun; under torchrun, only the first rank of
    this launch on this node to fail. Every rank reads the same config, so a bad key would otherwise be printed
    once per process. The claim is a file created exclusively, named by the launch: torchrun's run id and its
    agent, the workers' parent process (a rerun with the same --rdzv-id has a new agent)."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None:
        return True
    claim = Path(tempfile.gettempdir()) / f"pretrain-error-{run_id}-{os.getppid()}"
    try:
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    except OSError:  # no writable temp directory: print, as outside torchrun
        return True
    return True


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.commands.get(args.command, parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        code = args._run(args)
    except UsageError as e:
        if first_to_report():
            print(f"pretrain {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"pretrain {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `pretrain plan | head`
        return 0
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
