"""The package version (one place: the root package and stored measurements read it)."""

__version__ = "0.1.0"
