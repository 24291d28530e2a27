"""The package version (one place; the cache key and the doctor read it)."""

__version__ = "0.1.0"
