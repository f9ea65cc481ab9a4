"""`python -m edgespec.cli ...` runs the `edgespec` command."""

from edgespec.cli import main

main()
