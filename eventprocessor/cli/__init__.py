"""The ``eventprocessor`` command line: the demo, the benchmarks and the local tools.

It sits on top of the rest of the package: the processor, the stores
(:mod:`eventprocessor.stores`) and the local emulators (:mod:`eventprocessor.emulators`);
nothing outside this sub-package imports it.
"""
from .commands import main

__all__ = ["main"]
