import sys

from dtjob.cli import main

sys.exit(main())
