"""This project's studies: each study's analysis of its grids and the tables and plots
rendered from them (the findings in results/).

Outside the core library: nothing in qcal's layers (quant, model, methods, packing, calib,
eval, data, recipe, run, the grid runner, the commands) imports this package, which
is checked by tests/unit/test_layering.py. It builds on `qcal.grid`'s cells and reports.
"""
