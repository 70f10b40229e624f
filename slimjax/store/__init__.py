"""The store floor: the only code that imports zarr. ``sink`` writes grid blocks into a store that
appears atomically when complete; ``coefficients`` owns the calibration store's layout."""

from .sink import ZarrSink, check_target, open_store, write_dataset

__all__ = ["ZarrSink", "check_target", "open_store", "write_dataset"]
