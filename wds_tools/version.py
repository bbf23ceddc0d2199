"""The wds-tools version, in a module of its own so that reading it imports nothing else."""

__all__ = ["__version__"]

__version__ = "0.1.0"
