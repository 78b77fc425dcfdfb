"""The ``eventprocessor`` command line: the demo, the benchmarks and the local tools.

It sits on top of the SDK (``eventprocessor``), the stores (``stores``) and the local
emulators (``emulators``); nothing in those imports it.
"""
from .commands import main

__all__ = ["main"]
