"""``python -m benchmarks.convergence``."""
import sys

from . import main

sys.exit(main())
