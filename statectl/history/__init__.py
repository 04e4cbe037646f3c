"""A checkpoint's history (``statectl history``, ``statectl report``): per batch its sources'
advance and each operator's rows, bytes and snapshot lag (``build``, from ``store_files`` and
``sources``), and what they add up to (``summary``)."""

from statectl.history.build import ROWS_MODES, history

__all__ = ["ROWS_MODES", "history"]
