"""``python -m npstream.cli``: the same as the ``npstream`` script."""

import sys

from npstream.cli.main import main

sys.exit(main())
