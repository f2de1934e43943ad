"""What makes a file a support bundle: the format's name and version, the manifest's name, and the one error every
part raises. A module of its own so that the writer (``_archive``) and the reader (``_inspect``) share them without
importing each other."""

from __future__ import annotations

FORMAT = "codesdk-support-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


class BundleError(Exception):
    """A bundle that cannot be written or read (the message is one line for the user)."""
