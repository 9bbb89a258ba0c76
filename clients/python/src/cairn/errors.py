"""The client's exceptions. Every one is a `CairnError`:

- one class per error code the API documents (`NotFound`, `ActionIdConflict`,
  `CandidateHeld`, ...), raised with the API's own message; a code this client does not
  know raises `CairnError` itself;
- `InvalidInput`: refused before anything was sent;
- `TransportError`: the scheduler could not be reached, or a read failed (a write never
  fails this way once it may have been sent);
- `OutcomeUnknown`: a write may have been applied, but its answer was lost;
- `UnexpectedResponse`: an answer the document does not describe;
- `WaitTimeout`: `wait()` gave up.
"""

from . import _error_codes, _exceptions
from ._error_codes import *  # noqa: F403
from ._error_codes import ERROR_CLASSES
from ._exceptions import *  # noqa: F403

# Tracebacks name the classes where users import them from: cairn.errors.NotFound.
for _class in [*ERROR_CLASSES.values(), *(getattr(_exceptions, name) for name in _exceptions.__all__)]:
    _class.__module__ = __name__

__all__ = ["ERROR_CLASSES"]
__all__ += _exceptions.__all__
__all__ += _error_codes.__all__
