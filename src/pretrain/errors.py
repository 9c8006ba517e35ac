"""Errors a user can fix. The CLI prints them as one line on stderr and exits with code 2."""


class UsageError(Exception):
    """Bad input (a config key, a path, a flag): the message names the problem and the fix."""


class ConfigError(UsageError):
    """A config value is unknown, out of range or inconsistent with another one."""


def json_kind(value: object) -> str:
    """What a parsed JSON value is, in JSON's words ("an array", "null"), for an error about the wrong one."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else "true" if value else "false"
    kinds = ((dict, "an object"), (list, "an array"), (str, "a string"), ((int, float), "a number"))
    return next((name for types, name in kinds if isinstance(value, types)), type(value).__name__)
