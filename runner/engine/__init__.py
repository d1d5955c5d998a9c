"""The container engine adapter: the only room that speaks Docker's API. ``api`` (the EngineAPI protocol
the rest types against), ``docker_adapter`` (the one docker-py importer; engine errors translated once),
``hostconfig`` (a policy and a RunSpec -> the create-container body, every hardening knob with its threat),
``seccomp`` (the profile), ``hostpaths`` (mount sources as the engine's host names them)."""
