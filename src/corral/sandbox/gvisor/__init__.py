"""The `gvisor` backend: the command runs on gVisor's user-space kernel (runsc).

`bundle` builds the OCI bundle and the runsc command line (pure);
`backend` checks the host, starts runsc in the sandbox's cgroup and tears it
down. `GVisorConfig.load()` (sandbox/backend.py) imports this package.
"""

from corral.sandbox.gvisor.backend import GVisorBackend, GVisorSandbox

__all__ = ["GVisorBackend", "GVisorSandbox"]
