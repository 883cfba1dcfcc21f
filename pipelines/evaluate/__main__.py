import sys

from pipelines.evaluate.cli import main

sys.exit(main())
