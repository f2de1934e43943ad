"""``python -I -m codesdk.worker.mcp.bridge``: the bridge process (see ``main``)."""

import sys

from .main import main

sys.exit(main(sys.argv[1:]))
