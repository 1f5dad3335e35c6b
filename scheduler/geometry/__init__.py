"""Exact region arithmetic: boxes, normalized regions and region maps.

Sealed value types: modules outside this package use their public methods only
(the fast paths the generators need, such as ``Region.bounds``, ``Box.from_bounds``
or ``RegionMap.snapshot``, are methods of the types, tuned here once).
"""
from .box import Box, Subrange
from .region import Region, as_region, split_overlapping
from .region_map import RegionMap

__all__ = ["Box", "Region", "RegionMap", "Subrange", "as_region", "split_overlapping"]
