"""The container engine adapter: the only room that speaks Docker's API, and the ground floor of the host side.

``api`` (the EngineAPI protocol the rest types against), ``docker_adapter`` (the one docker-py importer;
engine errors translated once), ``knobs`` (what a runtime and an engine flavour change, as values),
``hostconfig`` (a policy and a RunSpec -> the create-container body, every hardening knob with its threat),
``labels`` (the run's spec, its container name and the label keys every object of a run carries),
``ownership`` (the owning process, in its namespace, as the labels record it), ``seccomp`` (the profile),
``hostpaths`` (mount sources as the engine's host names them), ``attach`` (the worker's stdio over the
engine's attach stream) and ``sharedfiles`` (the image's program files in volumes shared by its runs).

Rule (tested in tests/unit/test_layering.py): this room imports neither a run's options nor ``lifecycle``,
nor anything above them; what it needs of them (the egress proxy's image) is handed in.
"""
