"""``toolcage.image``: the worker Dockerfile, its pinned requirements (data) and the offline build (``build``)."""
