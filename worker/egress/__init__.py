"""The egress side. In the sandbox: ``safefetch`` (the handlers' only HTTP client) and ``relay``
(127.0.0.1:3128 -> the proxy's socket). In the egress proxy's own container, a separate program
(``python -m toolcage.worker.egress.proxy``): ``proxy``, ``headcheck``, ``clienthello``, ``decisionlog``."""
