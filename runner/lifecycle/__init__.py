"""What every run leaves behind and how it is cleaned up: the audit chain (``audit``, ``audit_file``,
``records``), removal off the caller's path (``removal``), the deadline kill (``watchdog``) and the reaper
of runs whose owner died (``reaper``; who owns a run is ``toolcage.engine.ownership``, as the labels say).

Rule (tested in tests/unit/test_layering.py): this room never imports the library's front (``Sandbox``,
``AsyncSandbox``, ``Pool``) nor a run's home (``run``, ``options``): it stands on the engine adapter.
"""
