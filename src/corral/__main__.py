"""`python -m corral`."""

from corral.cli import main

main()
