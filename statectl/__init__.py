"""statectl: savepoints for Spark Structured Streaming."""

__version__ = "0.1.0"
