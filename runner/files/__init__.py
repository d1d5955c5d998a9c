"""The files facet: what crosses the sandbox's wall as files, in both directions.

In: ``upload`` (a tar the host writes; the writable copy's source walked by ``mountview``'s rule).
Out: ``download`` (a hostile tar stream checked entry by entry by ``safetar`` into staging, then renamed),
``batch`` (``write_files``/``read_files``), ``changes`` (the copy's diff: ``changesides`` streams both sides,
``gitplumb`` has git write it, ``gitdiff`` reads git's names), ``snapshot`` (``snapseal`` seals the archive,
``snapscan`` looks for secrets in it), and ``outbound`` (the one rule every door out applies).

Rule (tested in tests/unit/test_layering.py): this room never imports the library's front (``Sandbox``,
``AsyncSandbox``, ``Pool``). Each door takes a *call function* (``call(tool, params) -> CallResult``), so the
Ray agent and the framework adapters reuse it as it is.
"""
