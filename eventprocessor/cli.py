"""The ``eventprocessor`` command line: ``demo`` and ``bench``."""
from __future__ import annotations

import asyncio
import importlib
import logging
import sys
from pathlib import Path
from typing import List, Optional

import click

from . import __version__
from .balancer import LoadBalancingStrategy

BENCHMARKS = {
    "convergence": "Rebalance convergence: this SDK vs azure-eventhub's load balancer, simulated.",
    "throughput": "Events/s through an EventProcessor vs a bare asyncio loop.",
    "store_bench": "Checkpoint-store throughput and latency on Azurite vs the official blob store.",
    "spark_sink": "Rows/s through the Spark sink vs Spark writing Parquet directly.",
}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="eventprocessor")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def main(verbose: int) -> None:
    """Run consumers of a partitioned event stream with balanced, fenced ownership."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@main.command()
@click.option("--partitions", default=16, show_default=True, type=click.IntRange(1, 4096), help="Partitions.")
@click.option("--processors", default=4, show_default=True, type=click.IntRange(1, 256),
              help="Processors in this process.")
@click.option("--strategy", type=click.Choice([s.value for s in LoadBalancingStrategy]), default="balanced",
              show_default=True, help="balanced: one new partition per tick; greedy: the fair share at once.")
@click.option("--interval", default=0.5, show_default=True, type=click.FloatRange(min=0.01),
              help="Load-balancing interval in seconds.")
@click.option("--expiration", default=4.0, show_default=True, type=click.FloatRange(min=0.05),
              help="Ownership expiration in seconds (failover waits this long after a crash).")
@click.option("--rate", default=400.0, show_default=True, type=click.FloatRange(min=0),
              help="Events per second the producer sends (0 = as fast as it can).")
@click.option("--store", type=click.Choice(["memory", "azurite"]), default="memory", show_default=True,
              help="memory: in-process; azurite: Blob storage on a local Azurite (started if none runs).")
@click.option("--timeout", default=60.0, show_default=True, help="Give up on a phase after this many seconds.")
def demo(partitions: int, processors: int, strategy: str, interval: float, expiration: float, rate: float,
         store: str, timeout: float) -> None:
    """Producer and processors in one process: convergence, scale-in, crash, failover.

    Ends with a summary of events produced, processed, lost (must be 0) and
    duplicated. Exits 1 if any event was lost.
    """
    from rich.console import Console

    from .demo import DemoConfig, run_demo, summary_table

    if expiration <= interval:
        raise click.BadParameter("must be longer than --interval", param_hint="--expiration")
    console = Console()
    config = DemoConfig(partitions=partitions, processors=processors, strategy=LoadBalancingStrategy(strategy),
                        interval=interval, expiration=expiration, rate=rate, store=store, timeout=timeout)
    try:
        result = asyncio.run(run_demo(config, console))
    except KeyboardInterrupt:
        sys.exit(130)
    except TimeoutError as error:
        raise click.ClickException(str(error)) from None
    console.print(summary_table(result))
    if result.lost:
        console.print(f"[red]{result.lost} events were lost[/]")
        sys.exit(1)


def _import_benchmark(name: str):
    try:
        return importlib.import_module(f"benchmarks.{name}")
    except ModuleNotFoundError as error:
        checkout = Path(__file__).resolve().parent.parent
        if (checkout / "benchmarks" / f"{name}.py").exists() and str(checkout) not in sys.path:
            sys.path.insert(0, str(checkout))
            return importlib.import_module(f"benchmarks.{name}")
        raise click.ClickException(
            f"benchmark {name!r} is not available ({error}); benchmarks run from a source checkout") from None


@main.group()
def bench() -> None:
    """Run a benchmark under benchmarks/ (results go to benchmarks/RESULTS.md).

    Each benchmark takes its own options: eventprocessor bench NAME --help.
    """


def _bench_command(name: str, help_text: str) -> click.Command:
    @click.command(name=name.replace("_", "-"), help=help_text + " Options: see --help.",
                   context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
                   add_help_option=False)
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def command(args: List[str]) -> None:
        module = _import_benchmark(name)
        code: Optional[int] = module.main(list(args))
        sys.exit(code or 0)

    return command


for _name, _help in BENCHMARKS.items():
    bench.add_command(_bench_command(_name, _help))


if __name__ == "__main__":  # pragma: no cover
    main()
