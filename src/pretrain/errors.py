"""Errors a user can fix. The CLI prints them as one line on stderr and exits with code 2."""


class UsageError(Exception):
    """Bad input (a config key, a path, a flag): the message names the problem and the fix."""


class ConfigError(UsageError):
    """A config value is unknown, out of range or inconsistent with another one."""
