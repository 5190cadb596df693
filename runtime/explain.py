"""``python -m runtime.explain``: see ``runtime.cli.explain``."""

import sys

from runtime.cli.explain import main

if __name__ == "__main__":
    sys.exit(main())
