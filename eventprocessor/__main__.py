"""``python -m eventprocessor``: the same as the ``eventprocessor`` command."""
from .cli.commands import main

main(prog_name="eventprocessor")
