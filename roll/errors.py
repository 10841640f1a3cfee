"""The one exception that ends a run on purpose: the launcher prints its one-line message and exits with 1."""


class RunStopped(RuntimeError):
    """The run cannot usefully go on; the message says why in one line (the launcher prints it, exit code 1)."""
