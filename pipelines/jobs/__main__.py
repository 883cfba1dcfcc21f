"""`python -m pipelines.jobs <command>`: see `pipelines.jobs.cli`."""

import sys

from pipelines.jobs.cli import main

sys.exit(main())
