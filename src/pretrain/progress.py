"""Progress bars, one rule for every subcommand: rich's bar on stderr (stdout stays for tables and JSON),
and only on a terminal, so logs and pipes get no control characters."""

from __future__ import annotations

import contextlib


def terminal_bar(*columns, enabled: bool = True, transient: bool = False, file=None):
    """A rich `Progress` with these columns, or None when disabled or stderr is not a terminal. `file`: the
    stream to draw on when the caller sends sys.stderr elsewhere meanwhile (a log file), which the bar then
    leaves there (default: sys.stderr, whose writes rich shows above the bar)."""
    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=True) if file is None else Console(file=file)
    if not enabled or not console.is_terminal:
        return None
    return Progress(*columns, console=console, transient=transient, redirect_stderr=file is None)


@contextlib.contextmanager
def counting_bar(label: str, enabled: bool = True, eta: bool = False, file=None):
    """Yields `advance(done, total, description)` for a loop over items (sweep cells, benchmark shapes), or
    None; transient: the result table replaces it. `file`: as terminal_bar's."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    columns = [TextColumn(f"{label} {{task.description:<36}}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    if eta:
        columns += [TextColumn("ETA"), TimeRemainingColumn()]
    bar = terminal_bar(*columns, enabled=enabled, transient=True, file=file)
    if bar is None:
        yield None
        return
    with bar:
        task = bar.add_task("", total=None)
        yield lambda done, total, description: bar.update(task, completed=done, total=total, description=description)


@contextlib.contextmanager
def quiet_transformers():
    """Yields `transformers`, quiet within the block: no weight-loading progress bar (written to stderr even in
    a pipe, in the middle of our output), and nothing of what torchao says when transformers imports it while
    loading weights (its CUDA kernels fail to load on a CPU-only torch; enum registrations torch 2.13 calls
    deprecated)."""
    import logging

    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        import transformers

        transformers.utils.logging.disable_progress_bar()
        yield transformers
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)
