import sys

from pipelines.multitask.cli import main

sys.exit(main())
