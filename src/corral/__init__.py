"""corral: run coding agents unattended with verifiable host guarantees."""

__all__ = ["__version__"]

__version__ = "0.1.0"
