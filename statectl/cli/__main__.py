"""``python -m statectl.cli``: the same as the ``statectl`` command (the tests run it so)."""

from statectl.cli import run

if __name__ == "__main__":
    run()
