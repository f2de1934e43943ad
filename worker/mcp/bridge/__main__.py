"""``python -I -m worker.mcp_bridge``: the bridge process (see ``_server``)."""

import sys

from ._server import main

sys.exit(main(sys.argv[1:]))
