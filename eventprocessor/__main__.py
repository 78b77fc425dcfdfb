"""``python -m eventprocessor``: the same as the ``eventprocessor`` command."""
from .cli import main

main(prog_name="eventprocessor")
