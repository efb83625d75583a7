import sys

from dtjob.cli.main import main

sys.exit(main())
