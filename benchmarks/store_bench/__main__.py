"""``python -m benchmarks.store_bench``."""
import sys

from . import main

sys.exit(main())
