"""``python -m runtime.evaluate``: the validation loss of a checkpoint; see ``runtime.cli.validate``."""

import sys

from runtime.cli.validate import main

if __name__ == "__main__":
    sys.exit(main())
