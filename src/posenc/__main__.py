"""``python -m posenc``: the same as the ``posenc`` command."""

from posenc.cli import main

if __name__ == "__main__":
    main()
