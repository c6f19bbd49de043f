"""``python -m mlxlab.cli`` (what scripts/h200.sh runs): the ``mlxlab`` command."""

import sys

from mlxlab.cli import main

sys.exit(main())
