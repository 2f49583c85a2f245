"""``python -m lakestep.serve``: the command ``lakestep serve``."""

if __name__ == "__main__":
    import sys

    from lakestep.cli import main

    raise SystemExit(main(["serve", *sys.argv[1:]]))
