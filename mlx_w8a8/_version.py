"""The package version, in a module of its own: the build reads it here
(``pyproject.toml``) without importing the package, and modules that stamp it into
tables and checkpoints import it without importing the package's public API."""

__version__ = "0.1.0"
