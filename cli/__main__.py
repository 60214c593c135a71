"""`python -m cli …` is `brorl …` (how `brorl run` starts its roles and how tests start them)."""

import sys

from cli import main

if __name__ == "__main__":
    sys.exit(main())
