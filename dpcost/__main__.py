"""``python -m dpcost``: see :mod:`dpcost.cli`."""

import sys

from dpcost.cli import main

sys.exit(main())
