"""``python -m toolcage.cli``: the same as the ``toolcage`` command (``run`` through the daemon when one runs)."""

from toolcage.cli.entry import main

main()
