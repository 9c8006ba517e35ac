"""Checkpoints that survive crashes: atomic, checksummed, resumable on another number of ranks.

  format.py         a checkpoint's files: the layout, the atomic checksummed write, `verify`, the loads
  choice.py         which checkpoint a resume, a rollback or a reader uses, and which ones pruning keeps
  compatibility.py  whether a resume may continue from a checkpoint with this config
  contents.py       what a checkpoint holds, saved and loaded as one (`Checkpoints`), and `load_model`
  run_dir.py        the run directory (`RunDir`): its lock, config.yaml, partial writes, what is set aside
Each module imports only modules above it in this list. When the trainer writes one is
train/callbacks/checkpointing.py's; `pretrain eval`, export and generate read a model with `load_model`.
"""
