"""`python -m minivtc.bench ...` is `minivtc bench ...`; `python -m minivtc.bench gpu` is the GPU
check (for an environment without the `minivtc` script)."""

import sys

from minivtc.bench.suite import main

sys.exit(main())
