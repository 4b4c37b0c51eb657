"""``python -m opreg.cli``: the ``opreg`` command line."""

from opreg.cli import script

if __name__ == "__main__":
    raise SystemExit(script())
