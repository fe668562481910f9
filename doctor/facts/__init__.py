"""Facts apart from judgments: the store every check reads through ``ctx.fact(name)``.

Collectors (``@collector`` in each area's ``doctor/<area>/facts.py``) gather JSON-serialisable
facts from the live host: NVML readings, files, the service interpreter's packages. Checks judge
them. The same facts, recorded with ``k26-doctor snapshot``, replay any host with
``check --from-snapshot FILE``.

Modules, by role: ``store`` (``FactStore``, ``CollectOptions``, ``FactUnavailable``, ``MalformedFact``: one
collection per fact and run, a lock per fact, under the collector's deadline), ``isolation`` (a
collector in a killable child process; ``worker`` is its entry point), ``redaction`` (secrets out of
facts and reports), ``snapshot`` (snapshot files: build, load).
"""
