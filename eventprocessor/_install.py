"""The old name of :mod:`eventprocessor.extras`, kept importable for the modules that
still import it."""
from __future__ import annotations

from .extras import install_command, source_checkout

__all__ = ["install_command", "source_checkout"]
