"""The operator's views: ``doctor`` (and its in-sandbox ``probes``), what the engines can run
(``engines``), and ``ps``/``inspect``-style views of live runs (``views``). Read-only but for ``gc``.

Rule (tested in tests/unit/test_layering.py): this room returns reports as data and never imports the CLI;
``toolcage.cli`` prints them (``cli/doctor.py``, ``cli/ops.py``), and the Ray agent reuses ``views`` as is."""
