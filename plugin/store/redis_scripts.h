/*
 * redis_scripts.h -- the Lua scripts of the Redis store (see redis.c).
 *
 * Every operation is ONE script, so it is atomic on the server (no other
 * client's command runs between its steps) and costs one round trip.  All
 * validation happens before the first write, so a script never stops
 * half-way; the "#!lua" shebang (Redis 7) makes the server refuse a writing
 * script up front when it is out of memory, instead of failing mid-way.
 *
 * Data layout, for prefix P (history_key_prefix) and a conversation key CID
 * (the conversation id qualified by persona and interface, see redis.c):
 *   P c:CID      hash   id, persona, iface, created, last_used, bytes
 *   P t:CID      list   turn ids, oldest first
 *   P turn:TID   hash   cid, started, finished, n (messages), msgs (the
 *                       messages joined by ','), meta ("id\trole\tms\n" per message)
 *   P lru        zset   CID scored by a commit counter (P seq): least recently used first
 *   P seq        string the commit counter
 *   P lease:CID  string the token of the store object (host) running a turn on
 *                       CID, with a short TTL its holder renews (store.h, version 2)
 * Every key of a conversation carries a TTL of the idle timeout plus a grace
 * (refreshed at each commit), so Redis itself drops what nobody forgets.
 *
 * Arguments common to every script: ARGV[1] = P, ARGV[2] = now (ms since the
 * epoch, the caller's clock), ARGV[3] = idle timeout in ms (0 = never).
 */
#ifndef PARLEY_REDIS_SCRIPTS_H
#define PARLEY_REDIS_SCRIPTS_H

#define REDIS_LUA_PRELUDE                                                                      \
    "#!lua\n"                                                                                  \
    "local P, now, timeout = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])\n"                  \
    "local LRU = P .. 'lru'\n"                                                                 \
    "local function ckey(cid) return P .. 'c:' .. cid end\n"                                   \
    "local function tkey(cid) return P .. 't:' .. cid end\n"                                   \
    "local function turnkey(id) return P .. 'turn:' .. id end\n"                               \
    "local function idle(last)\n"                                                              \
    "  last = tonumber(last)\n"                                                                \
    "  return timeout > 0 and now > last and now - last > timeout\n"                           \
    "end\n"                                                                                    \
    "local function forget(cid)\n"                                                             \
    "  for _, id in ipairs(redis.call('LRANGE', tkey(cid), 0, -1)) do\n"                       \
    "    redis.call('DEL', turnkey(id))\n"                                                     \
    "  end\n"                                                                                  \
    "  redis.call('DEL', tkey(cid), ckey(cid))\n"                                              \
    "  redis.call('ZREM', LRU, cid)\n"                                                         \
    "end\n"                                                                                    \
    /* 'live', nil (unknown, or dropped by its TTL), or 'expired' (forgotten now) */           \
    "local function state(cid)\n"                                                              \
    "  local last = redis.call('HGET', ckey(cid), 'last_used')\n"                              \
    "  if not last then return nil end\n"                                                      \
    "  if idle(last) then forget(cid) return 'expired' end\n"                                  \
    "  return 'live'\n"                                                                        \
    "end\n"

/* ARGV[4] = CID, ARGV[5] = last N turns (0 = all).
 * -> {expired 0/1, nmessages, "m1,m2,...,"} */
#define REDIS_LUA_LOAD                                                                         \
    "local cid, last = ARGV[4], tonumber(ARGV[5])\n"                                           \
    "local st = state(cid)\n"                                                                  \
    "if st ~= 'live' then return {st == 'expired' and 1 or 0, 0, ''} end\n"                    \
    "local ids = redis.call('LRANGE', tkey(cid), last > 0 and -last or 0, -1)\n"               \
    "local parts, count = {}, 0\n"                                                             \
    "for _, id in ipairs(ids) do\n"                                                            \
    "  local t = redis.call('HMGET', turnkey(id), 'n', 'msgs')\n"                              \
    "  if t[1] then\n"                                                                         \
    "    count = count + tonumber(t[1])\n"                                                     \
    "    parts[#parts + 1] = t[2]\n"                                                           \
    "    parts[#parts + 1] = ','\n"                                                            \
    "  end\n"                                                                                  \
    "end\n"                                                                                    \
    "return {0, count, table.concat(parts)}\n"

/* ARGV[4] = CID, 5 = conversation id, 6 = persona, 7 = interface, 8 = turn id,
 * 9 = started, 10 = finished, 11 = n, 12 = msgs, 13 = meta, 14 = keep turns
 * (0 = all), 15 = max conversations, 16 = TTL ms (0 = none), 17 = lease token
 * ("" = no lease: no fencing).
 * -> {appended 0/1, evicted, expired}, or the error "LEASE ..." when the
 *    lease on CID is no longer ours (nothing written).  A committed turn
 *    gives its lease back here: one round trip less per turn. */
#define REDIS_LUA_APPEND                                                                       \
    "local cid, tid = ARGV[4], ARGV[8]\n"                                                      \
    "local keep, maxc, ttl, token = tonumber(ARGV[14]), tonumber(ARGV[15]),\n"                 \
    "  tonumber(ARGV[16]), ARGV[17]\n"                                                         \
    "local lease = P .. 'lease:' .. cid\n"                                                     \
    "local ours = token ~= '' and redis.call('GET', lease) == token\n"                         \
    "if redis.call('EXISTS', turnkey(tid)) == 1 then\n"                                        \
    "  if ours then redis.call('DEL', lease) end\n"                                           \
    "  return {0, 0, 0}\n"                                                                     \
    "end\n"                                                                                    \
    "if token ~= '' and not ours then\n"                                                       \
    "  return redis.error_reply('LEASE the conversation lease expired and was taken over')\n"  \
    "end\n"                                                                                    \
    "local evicted, expired = 0, 0\n"                                                          \
    "local st = state(cid)\n"                                                                  \
    "if st == 'expired' then expired = 1 end\n"                                                \
    "if st == nil then forget(cid) end -- leftovers of keys dropped by TTL\n"         \
    "local ck, tk = ckey(cid), tkey(cid)\n"                                                    \
    "if st ~= 'live' then\n"                                                                   \
    "  redis.call('HSET', ck, 'id', ARGV[5], 'persona', ARGV[6], 'iface', ARGV[7],\n"          \
    "             'created', ARGV[2], 'bytes', 0)\n"                                           \
    "end\n"                                                                                    \
    "redis.call('HSET', ck, 'last_used', ARGV[2])\n"                                           \
    "redis.call('HSET', turnkey(tid), 'cid', cid, 'started', ARGV[9], 'finished', ARGV[10],\n" \
    "           'n', ARGV[11], 'msgs', ARGV[12], 'meta', ARGV[13])\n"                          \
    "redis.call('RPUSH', tk, tid)\n"                                                           \
    "redis.call('HINCRBY', ck, 'bytes', #ARGV[12])\n"                                          \
    "while keep > 0 and redis.call('LLEN', tk) > keep do\n"                                    \
    "  local old = redis.call('LPOP', tk)\n"                                                   \
    "  redis.call('HINCRBY', ck, 'bytes', -redis.call('HSTRLEN', turnkey(old), 'msgs'))\n"     \
    "  redis.call('DEL', turnkey(old))\n"                                                      \
    "end\n"                                                                                    \
    "redis.call('ZADD', LRU, redis.call('INCR', P .. 'seq'), cid)\n"                           \
    "while redis.call('ZCARD', LRU) > maxc do\n"                                               \
    "  local victim = redis.call('ZRANGE', LRU, 0, 0)[1]\n"                                    \
    "  if victim == cid then break end\n"                                                      \
    "  local last = redis.call('HGET', ckey(victim), 'last_used')\n"                           \
    "  if not last or idle(last) then expired = expired + 1 else evicted = evicted + 1 end\n"  \
    "  forget(victim)\n"                                                                       \
    "end\n"                                                                                    \
    "if ttl > 0 then\n"                                                                        \
    "  redis.call('PEXPIRE', ck, ttl)\n"                                                       \
    "  redis.call('PEXPIRE', tk, ttl)\n"                                                       \
    "  for _, id in ipairs(redis.call('LRANGE', tk, 0, -1)) do\n"                              \
    "    redis.call('PEXPIRE', turnkey(id), ttl)\n"                                            \
    "  end\n"                                                                                  \
    "end\n"                                                                                    \
    "if ours then redis.call('DEL', lease) end\n"                                              \
    "return {1, evicted, expired}\n"

/* ARGV[4] = CID.
 * -> {0} unknown, {1} expired now, or {2, id, created, last_used, {tid, started,
 *    finished, msgs}...} */
#define REDIS_LUA_GET_CONVERSATION                                                             \
    "local cid = ARGV[4]\n"                                                                    \
    "local st = state(cid)\n"                                                                  \
    "if st ~= 'live' then return {st == 'expired' and 1 or 0} end\n"                           \
    "local c = redis.call('HMGET', ckey(cid), 'id', 'created', 'last_used')\n"                 \
    "local out = {2, c[1], c[2], c[3]}\n"                                                      \
    "for _, id in ipairs(redis.call('LRANGE', tkey(cid), 0, -1)) do\n"                         \
    "  local t = redis.call('HMGET', turnkey(id), 'started', 'finished', 'msgs')\n"            \
    "  if t[1] then out[#out + 1] = {id, t[1], t[2], t[3]} end\n"                              \
    "end\n"                                                                                    \
    "return out\n"

/* ARGV[4] = turn id.
 * -> {0} unknown, {1} its conversation expired now, or {2, conversation id,
 *    started, finished, msgs} */
#define REDIS_LUA_GET_TURN                                                                     \
    "local t = redis.call('HMGET', turnkey(ARGV[4]), 'cid', 'started', 'finished', 'msgs')\n"  \
    "if not t[1] then return {0} end\n"                                                        \
    "local st = state(t[1])\n"                                                                 \
    "if st ~= 'live' then return {st == 'expired' and 1 or 0} end\n"                           \
    "return {2, redis.call('HGET', ckey(t[1]), 'id'), t[2], t[3], t[4]}\n"

/* -> {expired, {id, created, last_used, nturns, persona, iface}...} most recently used first */
#define REDIS_LUA_LIST                                                                         \
    "local out, expired = {0}, 0\n"                                                            \
    "for _, cid in ipairs(redis.call('ZREVRANGE', LRU, 0, -1)) do\n"                           \
    "  local st = state(cid)\n"                                                                \
    "  if st == 'live' then\n"                                                                 \
    "    local c = redis.call('HMGET', ckey(cid), 'id', 'created', 'last_used', 'persona',\n"  \
    "                         'iface')\n"                                                     \
    "    out[#out + 1] = {c[1], c[2], c[3], redis.call('LLEN', tkey(cid)), c[4] or '',\n"       \
    "                     c[5] or ''}\n"                                                       \
    "  else\n"                                                                                 \
    "    if st == nil then forget(cid) end\n"                                                  \
    "    expired = expired + 1\n"                                                              \
    "  end\n"                                                                                  \
    "end\n"                                                                                    \
    "out[1] = expired\n"                                                                       \
    "return out\n"

/* ARGV[4] = CID, or "" for every conversation.  -> how many were forgotten */
#define REDIS_LUA_FORGET                                                                       \
    "local cid = ARGV[4]\n"                                                                    \
    "if cid ~= '' then\n"                                                                      \
    "  local known = redis.call('EXISTS', ckey(cid)) == 1\n"                                   \
    "  forget(cid)\n"                                                                          \
    "  return known and 1 or 0\n"                                                              \
    "end\n"                                                                                    \
    "local all = redis.call('ZRANGE', LRU, 0, -1)\n"                                           \
    "for _, c in ipairs(all) do forget(c) end\n"                                               \
    "return #all\n"

/* -> how many conversations were idle past the timeout (and are now forgotten) */
#define REDIS_LUA_EXPIRE                                                                       \
    "local n = 0\n"                                                                            \
    "for _, cid in ipairs(redis.call('ZRANGE', LRU, 0, -1)) do\n"                              \
    "  local st = state(cid)\n"                                                                \
    "  if st ~= 'live' then\n"                                                                 \
    "    if st == nil then forget(cid) end\n"                                                  \
    "    n = n + 1\n"                                                                          \
    "  end\n"                                                                                  \
    "end\n"                                                                                    \
    "return n\n"

/* -> {conversations, turns, message bytes} (read only: like the memory store,
 *    it counts conversations idle but not yet forgotten) */
#define REDIS_LUA_STATS                                                                        \
    "local nc, nt, nb = 0, 0, 0\n"                                                             \
    "for _, cid in ipairs(redis.call('ZRANGE', LRU, 0, -1)) do\n"                              \
    "  local c = redis.call('HMGET', ckey(cid), 'last_used', 'bytes')\n"                       \
    "  if c[1] then\n"                                                      \
    "    nc = nc + 1\n"                                                                        \
    "    nt = nt + redis.call('LLEN', tkey(cid))\n"                                            \
    "    nb = nb + tonumber(c[2])\n"                                                           \
    "  end\n"                                                                                  \
    "end\n"                                                                                    \
    "return {nc, nt, nb}\n"

/* Leases: ARGV[4] = CID, 5 = token, 6 = lease ms.
 * acquire -> {1} taken, or {0, ms left on the holder's lease} */
#define REDIS_LUA_LEASE_ACQUIRE                                                                \
    "local key = P .. 'lease:' .. ARGV[4]\n"                                                   \
    "if redis.call('SET', key, ARGV[5], 'NX', 'PX', ARGV[6]) then return {1} end\n"            \
    "if redis.call('GET', key) == ARGV[5] then return {1} end -- a resent acquire\n"           \
    "return {0, redis.call('PTTL', key)}\n"

/* renew -> 1 still ours (extended), 0 lost */
#define REDIS_LUA_LEASE_RENEW                                                                  \
    "local key = P .. 'lease:' .. ARGV[4]\n"                                                   \
    "if redis.call('GET', key) ~= ARGV[5] then return 0 end\n"                                 \
    "redis.call('PEXPIRE', key, ARGV[6])\n"                                                    \
    "return 1\n"

/* release (compare and delete: never another holder's lease) -> 1 deleted, 0 not ours */
#define REDIS_LUA_LEASE_RELEASE                                                                \
    "local key = P .. 'lease:' .. ARGV[4]\n"                                                   \
    "if redis.call('GET', key) ~= ARGV[5] then return 0 end\n"                                 \
    "return redis.call('DEL', key)\n"

#endif
