"""``python -m lakestep <command> ...``: the ``lakestep`` command (lakestep/cli), for where the
console script is not on the PATH (``python -m lakestep coordinator``, ``... maintenance``,
``... publish``, ``... serve``). It needs the ``cli`` extra, as the console script does."""

import sys

from lakestep.cli import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
