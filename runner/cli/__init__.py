"""The command line: ``toolcage`` and its commands (``main``: the group, serve, tools, policy test;
``run``: run; ``mcp``, ``ops``, ``image``: their groups), the options the sandboxed commands share and
what they make of them (``options``, with ``policy_flags``), how the process starts and ends
(``startup``), how results and errors reach the terminal (``output``) and progress on long work
(``progress``). Only the CLI imports this room; the library never prints."""
