"""``python -m harness.cli``: the ``lockstep`` command without an installed entry point."""
import sys

from harness.cli import main

sys.exit(main())
