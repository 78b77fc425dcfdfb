"""Runnable benchmarks. Each module ``benchmarks/<name>.py`` is a program with
``main(argv=None, prog=None) -> int`` built on :mod:`benchmarks.toolkit`, and records its
results in its own section of ``benchmarks/RESULTS.md`` (``docs/benchmarks/index.md``)."""
