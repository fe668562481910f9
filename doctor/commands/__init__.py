"""Subcommands of the areas, loaded lazily by doctor.cli."""
