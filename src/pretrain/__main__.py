"""`python -m pretrain` is the `pretrain` command."""

import sys

from .cli import main

sys.exit(main())
