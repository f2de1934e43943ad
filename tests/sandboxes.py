"""What the exec tests share: a prober that reports the sandbox tools a test chooses, and why bubblewrap variants
skip where it is missing."""

from __future__ import annotations

from codesdk.supervisor.tools import SandboxProber, SandboxTools

NO_BWRAP = "bubblewrap is not installed or cannot run here (Debian: apt-get install bubblewrap; .ci/run installs it)"


class FixedProber(SandboxProber):
    """A prober that reports what the test says is available."""

    def __init__(self, tools: SandboxTools) -> None:
        super().__init__()
        self.tools = tools

    async def get(self) -> SandboxTools:
        return self.tools
