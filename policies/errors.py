"""Policy errors: one class, a message that names the file and the field."""


class PolicyError(ValueError):
    """A policy could not be found, parsed or validated.

    The CLI maps it to exit code 2 (usage or policy error).
    """

    exit_code = 2
