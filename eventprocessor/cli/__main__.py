"""``python -m eventprocessor.cli``: the same as the ``eventprocessor`` command."""
from .commands import main

main(prog_name="eventprocessor")
