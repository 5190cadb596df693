"""The one exception type a user can cause; the CLI prints it as a single line."""


class NanosetError(ValueError):
    """A user-facing error: the message names the file, key or value and says what to do."""
