"""The stack area's domain library: its facts (``facts.py``) and the public helpers that its checks,
fixers and the launcher share; what the service's Python stack holds, read from its files.

Modules here that the ``kernels`` probe imports under the service's interpreter (``elf``, ``fatbin``,
``abi``, ``scan``) are stdlib only and Python 3.8 compatible; keep this ``__init__`` free of imports.
"""
