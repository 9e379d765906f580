"""The Lua scripts of :class:`kvpool.chain_index.ChainIndex`, each one atomic in Redis.

Keys (``KEYS``, in this order, all under the index's prefix):

1. ``recency``: sorted set, every indexed block -> its last tick;
2. ``leaves``: sorted set, the indexed blocks no indexed block extends -> their last tick;
3. ``parent``: hash, block -> the block it extends (``""`` for a chain's first block);
4. ``kids``: hash, block -> how many indexed blocks extend it (absent when none);
5. ``size``: hash, block -> its bytes in the pool;
6. ``used``: the bytes of every indexed block;
7. ``clock``: the logical clock; every touched block gets its own tick, in chain order;
8. ``doomed``: sorted set, blocks evicted whose objects are being removed -> until when
   (Unix seconds, the Redis server's clock) no writer may write them or extend them;
9. ``counts``: hash of counters (``evicted``, ``refused``, ``forgotten``);
10. ``gone``: sorted set, evicted blocks whose objects were removed and that nobody wrote
    since -> until when (the doom's end) no writer may extend them: a writer that read such a
    block before its eviction would otherwise index a block whose parent is gone. Writing
    the block itself again is allowed, and indexing it takes it off this set.
"""

from __future__ import annotations

KEY_NAMES = (
    "recency",
    "leaves",
    "parent",
    "kids",
    "size",
    "used",
    "clock",
    "doomed",
    "counts",
    "gone",
)

_COMMON = """
local recency, leaves, parent, kids = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local size, used, clock, doomed, counts = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local gone = KEYS[10]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function drop(v)
  redis.call('ZREM', leaves, v)
  redis.call('ZREM', recency, v)
  local p = redis.call('HGET', parent, v)
  local s = tonumber(redis.call('HGET', size, v) or '0')
  redis.call('HDEL', parent, v)
  redis.call('HDEL', size, v)
  redis.call('HDEL', kids, v)
  redis.call('DECRBY', used, s)
  if p and p ~= '' then
    if redis.call('HINCRBY', kids, p, -1) <= 0 then
      redis.call('HDEL', kids, p)
      local ps = redis.call('ZSCORE', recency, p)
      if ps then redis.call('ZADD', leaves, ps, p) end
    end
  end
end
"""

CLAIM = (
    _COMMON
    + """
-- ARGV: budget (bytes; negative: no eviction), doom ttl (s), n, then n x (block, parent, size)
local budget, ttl, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', doomed, '-inf', now)
redis.call('ZREMRANGEBYSCORE', gone, '-inf', now)
local base = redis.call('INCRBY', clock, n) - n
local refused, flags, nrefused = {}, {}, 0
for i = 1, n do
  local m, p, s = ARGV[1 + 3 * i], ARGV[2 + 3 * i], tonumber(ARGV[3 + 3 * i])
  local tick = base + i
  local ok = not refused[m] and not redis.call('ZSCORE', doomed, m)
  if ok and p ~= '' then
    ok = not refused[p] and not redis.call('ZSCORE', doomed, p)
    ok = ok and not (redis.call('ZSCORE', gone, p) and not redis.call('ZSCORE', recency, p))
  end
  if ok then
    if not redis.call('ZSCORE', recency, m) then
      redis.call('ZREM', gone, m)
      redis.call('HSET', parent, m, p)
      redis.call('HSET', size, m, s)
      redis.call('INCRBY', used, s)
      if p ~= '' and redis.call('HINCRBY', kids, p, 1) == 1 then redis.call('ZREM', leaves, p) end
    end
    redis.call('ZADD', recency, tick, m)
    if not redis.call('HGET', kids, m) then redis.call('ZADD', leaves, tick, m) end
    flags[i] = '1'
  else
    refused[m] = true
    nrefused = nrefused + 1
    flags[i] = '0'
  end
end
if nrefused > 0 then redis.call('HINCRBY', counts, 'refused', nrefused) end
local victims = {}
if budget >= 0 then
  local u = tonumber(redis.call('GET', used) or '0')
  while u > budget do
    local top = redis.call('ZRANGE', leaves, 0, 0, 'WITHSCORES')
    if #top == 0 or tonumber(top[2]) > base then break end
    local v = top[1]
    u = u - tonumber(redis.call('HGET', size, v) or '0')
    drop(v)
    redis.call('ZADD', doomed, now + ttl, v)
    victims[#victims + 1] = v
  end
  if #victims > 0 then redis.call('HINCRBY', counts, 'evicted', #victims) end
end
return {table.concat(flags), victims}
"""
)
"""Index (or refresh) a run of blocks and evict leaves over the budget; returns the
per-block admission flags (``"1"``/``"0"``) and the evicted blocks."""

BURY = """
-- KEYS[1]: doomed, KEYS[2]: gone; ARGV: blocks whose objects are gone
for i = 1, #ARGV do
  local until_ = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if until_ then
    redis.call('ZREM', KEYS[1], ARGV[i])
    redis.call('ZADD', KEYS[2], until_, ARGV[i])
  end
end
return #ARGV
"""
"""The evicted blocks' objects are removed: writers may write them again, and until their
doom would have ended no block that extends one of them is indexed while it is not."""

SETTLE = (
    _COMMON
    + """
-- ARGV: f, then f blocks that were not written (each forgotten if no block extends it),
-- then the blocks that were written; returns those of them no longer indexed
local f = tonumber(ARGV[1])
local forgotten = 0
for i = 2, f + 1 do
  local m = ARGV[i]
  if redis.call('ZSCORE', recency, m) and not redis.call('HGET', kids, m) then
    drop(m)
    forgotten = forgotten + 1
  end
end
if forgotten > 0 then redis.call('HINCRBY', counts, 'forgotten', forgotten) end
local gone = {}
for i = f + 2, #ARGV do
  if not redis.call('ZSCORE', recency, ARGV[i]) then gone[#gone + 1] = ARGV[i] end
end
return gone
"""
)
"""After a write: forget what did not land, and name what was evicted while it was
written (its objects must go: nothing indexes them)."""
