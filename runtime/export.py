"""``python -m runtime.export``: see ``runtime.cli.export``."""

import sys

from runtime.cli.export import main

if __name__ == "__main__":
    sys.exit(main())
