"""``python -m lowtide.clients.cli``: the ``lowtide`` command where its script is not installed."""

import sys

from lowtide.clients.cli import main

sys.exit(main())
