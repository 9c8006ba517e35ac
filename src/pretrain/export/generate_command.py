"""Sample text from a trained run, to see what the model learned.

pretrain generate RUN_DIR --prompt "The for statement" [--max-new-tokens 100] [--temperature 0.8]
                  [--top-k 50] [--top-p 0.95] [--seed 0] [--tokenizer PATH]
"""

from __future__ import annotations

from ..config.reading import count_argument

HELP = "sample text from a run's newest checkpoint"


def add_arguments(p):
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (newest checkpoint) or one checkpoint")
    p.add_argument("--prompt", default="", help="text to continue (empty: start from <bos>)")
    p.add_argument("--max-new-tokens", type=count_argument, default=100)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", default=None, help="tokenizer directory or tokenizer.json (default: the run's)")


def run(args) -> int:
    import torch

    from ..checkpoint.contents import load_model
    from ..errors import UsageError
    from .command import tokenizer_of
    from .generate import generate_text

    if args.max_new_tokens < 0:  # before the model is loaded
        raise UsageError(f"--max-new-tokens {args.max_new_tokens} must be >= 0")
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError as e:  # undecodable bytes in argv arrive as lone surrogates (PEP 383)
        raise UsageError(f"--prompt is not valid UTF-8 text (character {e.start}); give UTF-8 text") from None
    model = load_model(args.run_dir)
    tokenizer = args.tokenizer or tokenizer_of(model)
    if tokenizer is None:
        raise UsageError(f"no tokenizer found for {args.run_dir} (its data directory is gone); pass --tokenizer PATH")
    generator = torch.Generator().manual_seed(args.seed)
    print(
        generate_text(
            model,
            tokenizer,
            args.prompt,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            generator=generator,
        )
    )
    return 0
