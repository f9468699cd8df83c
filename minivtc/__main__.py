"""`python -m minivtc ...` is the `minivtc` command (for an environment without its script)."""

import sys

from minivtc.cli.main import main

sys.exit(main())
