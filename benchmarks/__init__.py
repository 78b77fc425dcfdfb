"""Runnable benchmarks. Each module has ``main(argv=None) -> int`` and records its
results in ``benchmarks/RESULTS.md`` through :func:`benchmarks.results.write_section`."""
