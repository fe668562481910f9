"""The service's life cycle: the launch plan and exec (``launcher``), readiness (``readiness``), the systemd
unit (``systemd``) and the diagnosis of a failed start (``diagnose``)."""
