"""Errors that mean "the user gave us something wrong" (exit code 2).

Each carries a one-line message naming the file or the config key and what
was expected.  Entry points catch :class:`UserInputError`, print the message
and exit 2; anything else is a failure during training (exit 1).
"""

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2


class UserInputError(Exception):
    """Bad input or configuration; the message is shown to the user as is."""


class ConfigError(UserInputError):
    """A config file or override that does not match the schema."""


class DataError(UserInputError):
    """A data directory or file that is missing, malformed or too small."""
