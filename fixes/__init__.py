"""Fixers: each plans a list of ``fixes.actions.Action`` for one failing check.

Modules of this package register fixers with ``doctor.registry.fixer``; the generic actions
(commands, atomic file writes with backups, moves, stopping processes) live in ``fixes.actions``.
"""
