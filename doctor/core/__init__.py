"""The core every area builds on: the registry (checks, collectors, fixers, validated on load), the runner,
results, the context a check sees, settings, exit codes, the crash-safe writer, child processes with
deadlines, fix actions and the fix loop. The core imports no area (``checks``, ``fixes``, ``doctor/<area>``)."""
