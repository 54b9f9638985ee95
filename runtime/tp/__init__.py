"""Tensor parallelism (`Engine(tp=N)`): the model's heads and MLP features split over N
ranks, one process each, summed by all-reduces; the scheduler, radix cache and sampler run
once, on rank 0, which sends every forward's inputs to the other ranks."""

from braid.runtime.tp.group import RankFailure
from braid.runtime.tp.launch import Ranks, start_ranks
from braid.runtime.tp.rank import RankReport
from braid.runtime.tp.sharding import Shard, plan_shards

__all__ = ["RankFailure", "RankReport", "Ranks", "Shard", "plan_shards", "start_ranks"]
