"""The model floor: MODEL.md's formulas as pure functions of broadcastable arrays, and the specs they
take. One module per section — ``memory`` (§3), ``slim`` (§1), ``slim_kv`` (the optional variant),
``advisor`` (§2), ``roofline`` (§4), ``queue`` (§5), ``calculator`` (§3–§5 composed), ``rates`` and
``intervals``. No jit, no xarray, no I/O; imports nothing from slimjax above it.
"""
