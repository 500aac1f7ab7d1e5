"""`python -m superfluid.cli ...`, the same as the `superfluid` command."""

import sys

from .main import main

sys.exit(main())
