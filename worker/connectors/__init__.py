"""Connectors inside the sandbox: the handler host process (``handler_host``), the worker's side of it
(``host``), the ``@tool`` spec a handler declares (``spec``) and the SDK handlers import (``sdk``,
public as ``toolcage.sdk``)."""
