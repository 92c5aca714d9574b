"""The version of posenc, in one place (``posenc.__version__`` re-exports it)."""

__version__ = "0.1.0"
