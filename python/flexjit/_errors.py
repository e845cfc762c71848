"""The exceptions flexjit raises: every error of the C++ library, and spec diagnostics."""
import json


class FlexjitError(RuntimeError):
    """A launch flexjit refuses (wrong dtype, shape, device, a missing buffer, ...): the
    message says what, where and how to fix it."""


class CompileError(FlexjitError):
    """The mods (or the declarations made for the buffers and parameters) have errors.

    ``str(e)`` and ``e.text`` hold every diagnostic with its caret line; ``e.diagnostics`` is
    the structured list: dicts with code, message, file, line, col, end_line, end_col, label,
    notes and source_line.
    """

    def __init__(self, text, diagnostics_json="[]"):
        super().__init__(text)
        self.text = text
        self.diagnostics = json.loads(diagnostics_json)
