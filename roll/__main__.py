"""``python -m roll <command>``: the same as the ``roll`` console script."""

import sys

from roll.launch.cli import main

if __name__ == "__main__":
    sys.exit(main())
