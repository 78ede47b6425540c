"""`python -m corral`."""

from corral.cli import entry

entry()
