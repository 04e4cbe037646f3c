"""statectl's version, in a module of its own: savepoint metadata records it, and a module
that writes metadata must not import the package (whose ``__init__`` imports the API)."""

__version__ = "0.1.0"
