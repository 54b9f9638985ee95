"""Why a JSON schema could not be compiled."""


class UnsupportedSchema(ValueError):
    """A keyword (or a use of one) that a regex cannot enforce exactly."""


class InvalidSchema(ValueError):
    """The schema itself is malformed."""
