"""`python -m qcal ...` (and `torchrun -m qcal ...`) runs the command line."""

import sys

from qcal.cli import main

sys.exit(main())
