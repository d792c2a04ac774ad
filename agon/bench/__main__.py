"""``python -m agon.bench``: the side-by-side ratios of ``make bench`` (``agon.bench.ratios``)."""

import sys

from agon.bench.ratios import main

sys.exit(main())
