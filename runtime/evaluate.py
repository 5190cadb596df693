"""``python -m runtime.evaluate``: see ``runtime.cli.evaluate``."""

import sys

from runtime.cli.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
