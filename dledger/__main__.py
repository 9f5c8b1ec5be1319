"""``python -m dledger``: the same command line as the ``dledger`` console script."""

from dledger.cli import main

main()
