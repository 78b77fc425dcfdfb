"""``python -m eventprocessor_cli``: the same as the ``eventprocessor`` command."""
from .commands import main

main(prog_name="eventprocessor")
