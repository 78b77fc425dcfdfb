"""The package's version (setup.cfg names the same one)."""
__version__ = "0.1.0"
