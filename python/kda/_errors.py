"""kda.Error and the C ABI's status codes (capi/kda_c.h), shared by the package's modules."""

OK = 0
INVALID_ARGUMENT = 1
LIFECYCLE = 2
UNSUPPORTED = 3
CUDA = 4
OUT_OF_MEMORY = 5
IO = 6
INTERNAL = 7

CODE_NAMES = {OK: "ok", INVALID_ARGUMENT: "invalid_argument", LIFECYCLE: "lifecycle",
              UNSUPPORTED: "unsupported", CUDA: "cuda", OUT_OF_MEMORY: "out_of_memory",
              IO: "io", INTERNAL: "internal"}


class Error(Exception):
    """A failed kda call: ``code`` is a status (kda.INVALID_ARGUMENT, ...), str() the message."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.code_name = CODE_NAMES.get(code, "unknown")
        self.message = message

    def __repr__(self):
        return f"kda.Error({self.code_name}: {self.message!r})"


Error.__module__ = "kda"
