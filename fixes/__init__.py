"""Fixers: each plans a list of ``doctor.core.actions.Action`` for one failing check.

Modules of this package register fixers with ``doctor.core.registry.fixer``; the generic actions
(commands, atomic file writes with backups, moves, stopping processes) live in ``doctor.core.actions``.
"""
