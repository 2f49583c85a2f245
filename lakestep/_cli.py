"""What every lakestep command-line entry point shares: errors as one readable line."""

from __future__ import annotations

import sys
from typing import Callable

from .errors import LakestepError
from .secrets import mask_url


def run(main: Callable[[], int | None]) -> int:
    """Run ``main``; a :class:`LakestepError` becomes ``error: <message>`` on stderr and exit code 1."""
    try:
        return int(main() or 0)
    except LakestepError as e:
        print(f"error: {mask_url(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
