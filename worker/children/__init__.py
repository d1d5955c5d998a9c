"""How a call's processes start, are confined and end: the fork server (``zygote``, ``zygote_main``), the
call's own namespaces (``namespaces``, ``nsinit``), killing what a call left (``sweep``), its usage
(``cgroup``, ``usage``) and gVisor's per-call memory guard (``memguard``). Empty on purpose: loaded lazily."""
