import sys

from pipelines.mine.cli import main

sys.exit(main())
