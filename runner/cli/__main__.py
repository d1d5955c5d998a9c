"""``python -m toolcage.cli``: the same as the ``toolcage`` command."""

from toolcage.cli.main import main

main()
