#!/usr/bin/env python
"""Predicted damage (qcal calib diagnose) against a committed grid's perplexities ->
results/diagnose_<grid>.{json,md} (see qcal.studies.diagnose_study)."""

import sys

from qcal.studies.diagnose_study import main

if __name__ == "__main__":
    sys.exit(main())
