"""``python -m benchmarks.scale``."""
import sys

from . import main

sys.exit(main())
