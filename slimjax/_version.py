"""The package version, in its own module so that every floor can read it without importing upward."""

__version__ = "0.1.0"
