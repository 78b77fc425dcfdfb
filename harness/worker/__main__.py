"""``python -m harness.worker``: the worker program (see :mod:`harness.worker`)."""
import sys

from .program import main

sys.exit(main())
