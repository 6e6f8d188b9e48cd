"""The two kinds of failure the CLI turns into one clear line (DESIGN.md section 7)."""


class VerispecError(Exception):
    """A runtime failure: exit code 1, one line, no traceback."""

    exit_code = 1


class UsageError(VerispecError):
    """Bad flags or impossible settings: exit code 2."""

    exit_code = 2


class ModelFormatError(VerispecError):
    """A checkpoint directory that cannot be loaded as it is."""
