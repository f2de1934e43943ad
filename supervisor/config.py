"""Where the supervisor keeps its data, and the defaults an embedded supervisor starts with."""

from __future__ import annotations

import os
from pathlib import Path

#: The bootstrap admin token in the data dir (0600): what a local operator uses to reach the running service.
ADMIN_TOKEN_FILE = "admin.token"


def default_data_dir() -> Path:
    """``$CODESDK_DATA_DIR``, else ``$XDG_DATA_HOME/codesdk``, else ``~/.local/share/codesdk``."""
    if explicit := os.environ.get("CODESDK_DATA_DIR"):
        return Path(explicit)
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "codesdk"
