"""The runner's side of the JSON-RPC channel: ``session`` (requests, answers matched by id, cancel,
progress) over a ``transport`` (the byte stream to the worker and the inbound gate that parses it)."""
