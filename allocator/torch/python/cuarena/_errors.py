"""cuarena's exception types (no dependencies: imported by the torch-free config parser too)."""


class CuarenaError(RuntimeError):
    """cuarena could not do what was asked: its library is missing or was built for another
    torch, CUDA is already initialised, it is enabled already with another configuration, or a
    call into the library failed. The message says which and what to do."""


class ConfigError(CuarenaError, ValueError):
    """A configuration string or value is invalid: an unknown key, a bad value, or malformed
    syntax. The message names the key, its 0-based character position in the text it came from
    (CUARENA_CONF, PYTORCH_CUDA_ALLOC_CONF, ...) and the valid keys or the expected value."""


# Shown as cuarena.CuarenaError / cuarena.ConfigError in tracebacks.
CuarenaError.__module__ = ConfigError.__module__ = "cuarena"
