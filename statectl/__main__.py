"""``python -m statectl``: the same as the ``statectl`` command."""

from statectl.cli import run

if __name__ == "__main__":
    run()
