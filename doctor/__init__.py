"""k26-doctor: preflight diagnostics and repair for Kimi K2.6 on SGLang with DDTree, TP8 over NVLink.

The top-level package stays import-light on purpose: ``k26-doctor --help`` and ``list`` run on
every ``ExecStartPre`` and must not pay for importing anything heavy.
"""

__version__ = "0.1.0"
