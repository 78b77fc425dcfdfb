"""``python -m benchmarks.e2e``."""
import sys

from . import main

sys.exit(main())
