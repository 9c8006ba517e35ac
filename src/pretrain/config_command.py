"""Show the resolved config (presets expanded, overrides applied), or the documentation of every key.

pretrain config [CONFIG.yaml] [section.key=value ...]     the resolved YAML
pretrain config --docs                                   every key, its default and meaning (Markdown)
"""

from __future__ import annotations

import argparse

from .config_args import add_config_arguments, config_from_args

HELP = "print the resolved config, or document every key (--docs)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    p.add_argument("--docs", action="store_true", help="print the table of every config key (Markdown)")


def run(args: argparse.Namespace) -> int:
    from .config import docs_markdown

    if args.docs:
        print(docs_markdown())
        return 0
    import yaml

    print(yaml.safe_dump(config_from_args(args).to_dict(), sort_keys=False), end="")
    return 0
