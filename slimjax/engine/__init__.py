"""The engine floor: the output schema, the variable groups, the block plan, device dispatch and the
grid evaluation that turns a parsed sweep into result blocks and an xarray Dataset. Imports
:mod:`slimjax.inputs` and :mod:`slimjax.model` below it; nothing here touches zarr.
"""
