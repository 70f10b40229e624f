"""The inputs floor: catalogs (models, GPUs, hardware names), sweep files split by block (axes,
serving, measured, coefficients, advisor), and measured traces, all checked here with errors that name
the field and value. Imports only :mod:`slimjax.model` below it.
"""
