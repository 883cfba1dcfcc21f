import sys

from pipelines.encode.cli import main

sys.exit(main())
