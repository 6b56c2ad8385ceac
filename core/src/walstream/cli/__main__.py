"""``python -m walstream.cli``: the same as the ``walstream`` command."""

import sys

from walstream.cli import main

sys.exit(main())
