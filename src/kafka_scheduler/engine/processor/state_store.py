"""``ShardStore`` (engine/rules/store.py) over the processor's Spark state variables and the shard's timers."""

from __future__ import annotations

import pandas as pd

from ..rules.buckets import BucketInfo
from ..rules.entries import empty_entries
from ..rules.index_cache import IndexCache, IndexToken, cache_for
from ..rules.store import CHUNK_INDEX_COLUMNS
from .blobs import delta_blob, delta_of_blob, from_blob, ipc_table, to_blob


class MapStateShardStore:
    """``ShardStore`` over the processor's state variables and the shard's timers (``processor``: a WheelProcessor,
    whose ``init`` made them)."""

    def __init__(self, processor):
        self.p = processor
        self.shard: int | None = None
        self.cache: IndexCache | None = None

    def use_shard(self, shard: int) -> None:
        """The processor (and this store) serve every shard of a partition in turn."""
        self.shard, self.cache = shard, cache_for(shard)

    def next_seq(self):
        value = self.p.seq.get()
        seq = (int(value[0]) if value is not None else 0) + 1
        self.p.seq.update((seq,))
        return seq

    def index_token_get(self):
        value = self.p.index_token.get()
        if value is None:
            return None
        return IndexToken(
            int(value[0]), int(value[1]), [int(n) for n in value[2]], [int(n) for n in value[3]], int(value[4])
        )

    def index_token_put(self, token):
        self.p.index_token.update((token.version, token.base, list(token.nonces), list(token.sizes), token.entries))

    def delta_get(self, version, part):
        return delta_of_blob(self.p.deltas.getValue((version, part))[0])

    def delta_put(self, version, part, changes):
        self.p.deltas.updateValue((version, part), (delta_blob(changes),))

    def delta_remove(self, version, part):
        self.p.deltas.removeKey((version, part))

    def bucket_items(self):
        return [(int(key[0]), BucketInfo.from_row(value)) for key, value in self.p.buckets.iterator()]

    def bucket_keys(self):
        return [int(key[0]) for key in self.p.buckets.keys()]  # noqa: SIM118 - a Spark MapState, not a dict

    def chunk_index(self, bucket, n):
        value = self.p.chunks.getValue((bucket, n))
        if value is None:
            return pd.DataFrame(columns=CHUNK_INDEX_COLUMNS)
        return ipc_table(value[0]).select(CHUNK_INDEX_COLUMNS).to_pandas()

    def index_size(self) -> tuple[int, int]:
        """(version, entries) of the shard's index as state has them (no sync of the cache)."""
        token = self.index_token_get() or IndexToken()
        return token.version, token.entries

    def bucket_get(self, bucket):
        value = self.p.buckets.getValue((bucket,))
        return None if value is None else BucketInfo.from_row(value)

    def bucket_put(self, bucket, info):
        self.p.buckets.updateValue((bucket,), info.to_row())

    def bucket_remove(self, bucket):
        self.p.buckets.removeKey((bucket,))

    def chunk_get(self, bucket, n):
        value = self.p.chunks.getValue((bucket, n))
        return from_blob(value[0]) if value is not None else empty_entries()

    def chunk_put(self, bucket, n, entries):
        self.p.chunks.updateValue((bucket, n), (to_blob(entries),))

    def chunk_remove(self, bucket, n):
        self.p.chunks.removeKey((bucket, n))

    def strikes_get(self, bucket, n):
        value = self.p.strikes.getValue((bucket, n))
        return list(value[0] or ()) if value is not None else []

    def strikes_put(self, bucket, n, delivery_ids):
        self.p.strikes.updateValue((bucket, n), (list(delivery_ids),))

    def strikes_remove(self, bucket, n):
        self.p.strikes.removeKey((bucket, n))

    def armed_get(self, timer_ms):
        value = self.p.armed.getValue((timer_ms,))
        return [int(b) for b in value[0] or ()] if value is not None else []

    def armed_put(self, timer_ms, buckets):
        self.p.armed.updateValue((timer_ms,), (list(buckets),))

    def armed_remove(self, timer_ms):
        self.p.armed.removeKey((timer_ms,))

    def register_timer(self, timer_ms):
        self.p.handle.registerTimer(timer_ms)
        self.p.new_timers.append(timer_ms)

    def paused_get(self, sid):
        value = self.p.paused.getValue((bytes(sid),))
        return None if value is None else from_blob(value[0])

    def paused_put(self, sid, entry):
        self.p.paused.updateValue((bytes(sid),), (to_blob(entry),))

    def paused_remove(self, sid):
        self.p.paused.removeKey((bytes(sid),))

    def paused_items(self):
        return [(bytes(key[0]), from_blob(value[0])) for key, value in self.p.paused.iterator()]

    def levels_get(self):
        value = self.p.levels.get()
        return (
            None
            if value is None
            else (int(value[0]), [int(k) for k in value[1] or ()], [int(k) for k in value[2] or ()])
        )

    def levels_put(self, fine_mark, coarse, listed):
        self.p.levels.update((fine_mark, list(coarse), list(listed)))
