"""`python -m braid.runtime.cli`: the `braid` command."""

import sys

from braid.runtime.cli.main import main

sys.exit(main())
