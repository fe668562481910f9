"""The SGLang patch-set engine: status, transactional apply/revert, recovery, manifest generation.

Modules, each small:

- ``manifest``: the patch-set format (documented there) and its loader; sets resolve by name from
  ``<patches_dir>/<name>/`` (a site's own) or the package's ``sglang_patches/<name>/``
- ``record``: the installed wheel's ``dist-info/RECORD`` and METADATA (pristine hashes, version)
- ``locate``: the service interpreter's install, found by a probe without importing SGLang
- ``udiff``: strict unified-diff parsing and applying (no fuzz), pure Python
- ``status``: per file and per patch: pristine / applied / partial / drifted / missing
- ``state``: state directory: content-addressed backups, journal, lock, history
- atomic writes and ``__pycache__`` cleanup: ``doctor.core.fileio`` (the one crash-safe writer)
- ``engine``: plan -> journal -> write -> verify -> commit; roll back or recover an interrupted run
- ``generate``: (re)generate ``manifest.json`` from the diffs and a pristine install
"""
