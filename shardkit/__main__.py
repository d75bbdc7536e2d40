"""The ``shardkit`` command and ``python -m shardkit``: the CLI, with Ctrl-C during start-up handled too.

The package imports its modules on first use, so this starts at once; what the command needs is
imported inside the guard, and Ctrl-C at any moment exits 130 without a traceback.
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    try:
        from shardkit.cli.main import main as run

        code = run()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    if code == 130:
        # interrupted: every cleanup below the command has run; end here, since the interpreter's
        # shutdown can turn an interrupt that cut an import short into a death by SIGINT
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    return code


if __name__ == "__main__":
    sys.exit(main())
