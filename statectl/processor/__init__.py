"""The state processor: read, edit and compare savepoints and checkpoints from Python.

``statectl.open(path)`` (reading.py) opens either as a handle; ``SavepointWriter`` (writing.py)
writes an edited copy of one as a new savepoint; ``diff`` (diffing.py) compares two.
"""
