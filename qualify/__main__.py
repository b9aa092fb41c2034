"""``python -m qualify``: the same as the ``qualify`` console script."""

from qualify.cli import main

main()
