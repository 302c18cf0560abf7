"""`python -m pyshim.cli ...`: the `pyshim` command (how the test harness starts the dev server)."""

import sys

from pyshim.cli import main

sys.exit(main())
