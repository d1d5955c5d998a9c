"""The command line: ``toolcage`` and its commands (``main``: the group, run, serve, tools, policy test;
``mcp``, ``ops``, ``image``: their groups), how results and errors reach the terminal (``output``) and
progress on long work (``progress``). Only the CLI imports this room; the library never prints."""
