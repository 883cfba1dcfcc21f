"""`python -m pipelines.data <command>`: see `pipelines.data.cli`."""

import sys

from pipelines.data.cli import main

sys.exit(main())
