"""``python -m workerpool.gateway``: see :mod:`.main`."""

import sys

from .main import main

sys.exit(main())
