"""``python -m codesdk.testing.conformance [options] -- CMD ARGS…``."""

import sys

from . import main

sys.exit(main())
