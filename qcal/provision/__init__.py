"""Offline provisioning of this project's sources: the default models, the packaged text
corpora (the Debian handbook, Wikipedia summaries) and the benchmark data.

Outside the core library: only `qcal provision` (qcal.commands.provision) imports it, and
lazily; the rest of qcal reads what it wrote and knows no particular source. Checked by
tests/unit/test_layering.py.
"""
