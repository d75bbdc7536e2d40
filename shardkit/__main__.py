"""``python -m shardkit`` runs the CLI."""

import sys

from shardkit.cli import main

sys.exit(main())
