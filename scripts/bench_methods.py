#!/usr/bin/env python
"""Every method with and without the Hadamard rotation on the same calibration ids ->
results/methods.{json,md}; cells cached in results/methods_cells/ (see
qcal.studies.methods_bench for the flags)."""

import sys

from qcal.studies.methods_bench import main

if __name__ == "__main__":
    sys.exit(main())
