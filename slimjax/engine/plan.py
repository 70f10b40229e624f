"""The block plan: how a grid is cut into equal blocks whose working memory fits a budget.

Computed once per sweep and handed to the evaluation, the sink (its chunks) and the Dataset's attrs.
Blockable dims (schema.DIMS) are cut in grid order, leading ones first; the others stay whole.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Iterator

from ..errors import SlimjaxError
from .schema import DIMS


@dataclasses.dataclass(frozen=True)
class Block:
    """One block: index slices into the full grid along the blocked dims (valid, unpadded extents)."""

    slices: dict[str, slice]

    def region(self, dims: tuple[str, ...]) -> tuple[slice, ...]:
        return tuple(self.slices.get(d, slice(None)) for d in dims)

    @property
    def starts(self) -> tuple[int, ...]:
        return tuple(s.start for s in self.slices.values())


@dataclasses.dataclass(frozen=True)
class BlockPlan:
    dims: tuple[str, ...]  # the grid's dims, in order
    sizes: dict[str, int]  # full extent per dim
    block: dict[str, int]  # block extent per blocked dim (the last blocks are padded to it)
    bytes_per_cell: float  # working memory of one cell of the blocked dims (the whole of the others)
    budget_bytes: float

    @property
    def blocked(self) -> tuple[str, ...]:
        return tuple(self.block)

    @property
    def extents(self) -> tuple[int, ...]:
        return tuple(self.block.values())

    @property
    def n_blocks(self) -> int:
        return math.prod(math.ceil(self.sizes[d] / self.block[d]) for d in self.blocked)

    def blocks(self) -> Iterator[Block]:
        starts = [range(0, self.sizes[d], self.block[d]) for d in self.blocked]
        for combo in itertools.product(*starts):
            slices = zip(self.blocked, combo, strict=True)
            yield Block({d: slice(s, min(s + self.block[d], self.sizes[d])) for d, s in slices})

    def chunks(self, dims: tuple[str, ...]) -> tuple[int, ...]:
        """Store chunks of a variable: one label per chunk along label dims (model, gpu), the block
        extent along other blocked dims, whole elsewhere."""
        return tuple(1 if d in ("model", "gpu") else self.block.get(d, self.sizes[d]) for d in dims)

    def shards(self, dims: tuple[str, ...]) -> tuple[int, ...]:
        """Store shards of a variable: one block's extent (one file per block and variable: file creation,
        not bytes, bounds write speed on many filesystems), holding the :meth:`chunks` a read picks from."""
        return tuple(self.block.get(d, self.sizes[d]) for d in dims)

    def to_attrs(self) -> str:
        return json.dumps(
            {
                "dims": list(self.dims),
                "sizes": self.sizes,
                "block": self.block,
                "n_blocks": self.n_blocks,
                "bytes_per_cell": self.bytes_per_cell,
                "budget_bytes": self.budget_bytes,
            }
        )


def plan_blocks(
    sizes: dict[str, int], bytes_per_cell: float, budget_bytes: float, whole: frozenset = frozenset()
) -> BlockPlan:
    """Block extents so one block's working memory fits ``budget_bytes``. ``sizes`` are the grid's
    dims in order; ``bytes_per_cell`` the working memory of one cell of its blockable dims (the
    others whole, e.g. a cell's batch column)."""
    dims = tuple(sizes)
    block = {d: sizes[d] for d in dims if DIMS[d].blockable and d not in whole}
    total = lambda: math.prod(block.values()) * bytes_per_cell  # noqa: E731
    for axis in block:
        if total() <= budget_bytes:
            break
        rest = total() / block[axis]
        block[axis] = max(1, int(budget_bytes // rest))
        n_blocks = math.ceil(sizes[axis] / block[axis])
        block[axis] = math.ceil(sizes[axis] / n_blocks)  # even blocks, least padding
    if total() > budget_bytes:
        raise SlimjaxError(
            "memory_budget",
            f"{budget_bytes:.0f} bytes cannot hold one batch column of the grid ({bytes_per_cell:.0f} bytes needed)",
        )
    return BlockPlan(dims, dict(sizes), block, float(bytes_per_cell), float(budget_bytes))
