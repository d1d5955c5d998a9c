"""The operator's views: ``doctor`` (and its in-sandbox ``probes``), what the engines can run
(``engines``), and ``ps``/``inspect``-style views of live runs (``views``). Read-only but for ``gc``."""
