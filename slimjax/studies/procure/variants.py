"""Engine settings as procurement candidates (docs/engines.md, ``settings:``): a study per setting, run as any study,
their Datasets along dim ``setting``, and which setting sizes each (workload, rate, model) cheapest.

Every variable that depends on the candidates takes the ``setting`` dim; the workload's own inputs (total rate, its
length classes) do not. ``best_setting`` (workload, rate, model) names the setting of the cheapest choice ('' where no
setting has a feasible one; ties: the first listed).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import xarray as xr

WORKLOAD_DIMS = {"workload", "rate", "class"}  # a variable on these alone is the workload's, the same in every setting


def combine(parts: list[xr.Dataset], labels: list[str]) -> xr.Dataset:
    """Each setting's study Dataset (``parts``, in ``labels`` order) along dim ``setting``, with ``best_setting``."""
    shared = [name for name, v in parts[0].data_vars.items() if set(v.dims) <= WORKLOAD_DIMS]
    ds = xr.concat(
        [p.drop_vars(shared) for p in parts],
        dim=pd.Index(labels, name="setting"),
        data_vars="all",
        coords="minimal",
        compat="override",
        combine_attrs="override",
    )
    ds = xr.merge([ds, parts[0][shared]], combine_attrs="override")
    cost = ds["best_cost_per_hour"].fillna(np.inf)
    cheapest = cost.argmin("setting")
    none = ~np.isfinite(cost.min("setting"))
    best = np.where(none.values, "", np.asarray(labels, dtype=object)[cheapest.values])
    ds["best_setting"] = xr.Variable(
        cheapest.dims,
        best.astype(str),
        {"long_name": "engine setting of the cheapest choice across settings ('' when none is feasible)"},
    )
    ds.attrs["settings"] = json.dumps(labels)
    differ = sorted(k for k in parts[0].attrs if any(p.attrs.get(k) != parts[0].attrs[k] for p in parts))
    ds.attrs["setting_attrs"] = json.dumps([{k: p.attrs.get(k) for k in differ} for p in parts])
    return ds


def setting_view(ds: xr.Dataset, setting: str) -> xr.Dataset:
    """One engine setting's study out of a combined Dataset, with its own attrs (assumptions, serving table)."""
    i = [str(s) for s in ds["setting"].values].index(str(setting))
    view = ds.sel(setting=setting)
    own = json.loads(ds.attrs["setting_attrs"])[i] if "setting_attrs" in ds.attrs else {}
    view.attrs = {**ds.attrs, **own}
    return view
