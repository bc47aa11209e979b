"""``python -m chaosbench``: the same CLI as the ``chaosbench`` command (:func:`chaosbench.cli.main`)."""

import sys

from chaosbench.cli import main

sys.exit(main())
