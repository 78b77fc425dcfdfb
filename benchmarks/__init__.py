"""Runnable benchmarks. Each is a program, ``benchmarks/<name>.py`` or (when it is large) the
package ``benchmarks/<name>/``, with ``main(argv=None, prog=None) -> int`` built on
:mod:`benchmarks.toolkit`, and records its results in its own section of
``benchmarks/RESULTS.md`` (``docs/benchmarks/index.md``)."""
