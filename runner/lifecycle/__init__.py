"""What every run leaves behind and how it is cleaned up: the audit chain (``audit``, ``audit_file``,
``records``), who owns a container (``ownership``), removal off the caller's path (``removal``), the
deadline kill (``watchdog``) and the reaper of runs whose owner died (``reaper``)."""
