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
 *   P c:CID      hash   id, persona, iface, created, last_used, bytes, and its
 *                       lifetime (store.h version 4): lm (last message ms),
 *                       mc (messages), tc (turns), roles (STORE_ROLE_* bits),
 *                       and ctx, the context engine's record (store.h
 *                       version 5), when it has one
 *   P t:CID      list   turn ids, oldest first
 *   P turn:TID   hash   cid, started, finished, n (messages), msgs (the
 *                       messages joined by ','), meta ("id\trole\tms\n" per
 *                       message), lens ("l1,l2,..": each message's length in
 *                       msgs), tok (its size in tokens, store.h version 6;
 *                       absent: unknown), pos (the position of its first message; the
 *                       others follow), imid:I / md:I (message I's interface
 *                       message id / metadata, 0-based, when it has them)
 *   P im:CID     hash   interface message id -> "TID I" of the newest message
 *                       holding it (checked on use: a stale entry is redone)
 *   P lru        zset   CID scored by a commit counter (P seq): least recently used first
 *   P seq        string the commit counter
 *   P pos        string the position counter: INCRBY n per turn, so positions
 *                       increase with store order across every host
 *   P tpos       zset   TID scored by its first position: what a query over
 *                       every conversation walks, a slice per call
 *   P msg        hash   message id -> TID (get_message)
 *   P v4         string set once every conversation written before positions
 *                       and lifetimes existed has been upgraded (at open)
 *   P gc         string where the sweep's walk of P msg resumes
 *   P lease:CID  string the token of the store object (host) running a turn on
 *                       CID, with a short TTL its holder renews (store.h, version 2)
 * Every key of a conversation carries a TTL of the idle timeout plus a grace
 * (refreshed at each commit), so Redis itself drops what nobody forgets.
 * The global indexes (P tpos, P msg) carry none: forgetting a conversation
 * or dropping a turn removes its entries in the same script; entries left by
 * keys Redis dropped by TTL are removed when a read meets them (never
 * returned: every read checks the turn is still there) and by the sweep.
 *
 * Arguments common to every script: ARGV[1] = P, ARGV[2] = now (ms since the
 * epoch, the caller's clock), ARGV[3] = idle timeout in ms (0 = never).
 */
#ifndef PARLEY_REDIS_SCRIPTS_H
#define PARLEY_REDIS_SCRIPTS_H

#define REDIS_LUA_PRELUDE                                                                      \
    "#!lua\n"                                                                                   \
    "local P, now, timeout = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])\n"                   \
    "local LRU, POS, TPOS, MSG = P .. 'lru', P .. 'pos', P .. 'tpos', P .. 'msg'\n"             \
    "local function ckey(cid) return P .. 'c:' .. cid end\n"                                    \
    "local function tkey(cid) return P .. 't:' .. cid end\n"                                    \
    "local function turnkey(id) return P .. 'turn:' .. id end\n"                                \
    "local function imkey(cid) return P .. 'im:' .. cid end\n"                                  \
    "local function idle(last)\n"                                                               \
    "  last = tonumber(last)\n"                                                                 \
    "  return timeout > 0 and now > last and now - last > timeout\n"                            \
    "end\n"                                                                                     \
    "-- a turn's meta: {{id, role, created ms}...}\n"                                           \
    "local function meta_of(meta)\n"                                                            \
    "  local out = {}\n"                                                                        \
    "  for id, role, ms in string.gmatch(meta or '', '([^\\t\\n]*)\\t([^\\t\\n]*)\\t([^\\n]*)\\n') do\n" \
    "    out[#out + 1] = {id, role, ms}\n"                                                      \
    "  end\n"                                                                                   \
    "  return out\n"                                                                            \
    "end\n"                                                                                     \
    "-- \"l1,l2,..\": the lengths of the JSON objects joined by ',' in msgs (for\n"             \
    "-- turns stored before 'lens' was kept: split at the commas outside strings,\n"            \
    "-- arrays and objects)\n"                                                                  \
    "local function split_lens(s)\n"                                                            \
    "  local lens, depth, i, start, n = {}, 0, 1, 1, #s\n"                                      \
    "  while i <= n do\n"                                                                       \
    "    local j = string.find(s, '[{}%[%]\",]', i)\n"                                          \
    "    if not j then break end\n"                                                             \
    "    local c = string.sub(s, j, j)\n"                                                       \
    "    if c == '\"' then\n"                                                                   \
    "      local k = j + 1\n"                                                                   \
    "      while true do\n"                                                                     \
    "        local e = string.find(s, '[\"\\\\]', k)\n"                                         \
    "        if not e then j = n break end\n"                                                   \
    "        if string.sub(s, e, e) == '\\\\' then k = e + 2 else j = e break end\n"            \
    "      end\n"                                                                               \
    "    elseif c == '{' or c == '[' then depth = depth + 1\n"                                  \
    "    elseif c == '}' or c == ']' then depth = depth - 1\n"                                  \
    "    elseif depth == 0 then lens[#lens + 1] = j - start start = j + 1 end\n"                \
    "    i = j + 1\n"                                                                           \
    "  end\n"                                                                                   \
    "  lens[#lens + 1] = n - start + 1\n"                                                       \
    "  return table.concat(lens, ',')\n"                                                        \
    "end\n"                                                                                     \
    "-- a turn and its index entries\n"                                                         \
    "local function drop_turn(id)\n"                                                            \
    "  for _, m in ipairs(meta_of(redis.call('HGET', turnkey(id), 'meta'))) do\n"               \
    "    redis.call('HDEL', MSG, m[1])\n"                                                       \
    "  end\n"                                                                                   \
    "  redis.call('ZREM', TPOS, id)\n"                                                          \
    "  redis.call('DEL', turnkey(id))\n"                                                        \
    "end\n"                                                                                     \
    "local function forget(cid)\n"                                                              \
    "  for _, id in ipairs(redis.call('LRANGE', tkey(cid), 0, -1)) do drop_turn(id) end\n"      \
    "  redis.call('DEL', tkey(cid), ckey(cid), imkey(cid))\n"                                   \
    "  redis.call('ZREM', LRU, cid)\n"                                                          \
    "end\n"                                                                                     \
    "-- 'live', nil (unknown, or dropped by its TTL), or 'expired' (forgotten now)\n"           \
    "local function state(cid)\n"                                                               \
    "  local last = redis.call('HGET', ckey(cid), 'last_used')\n"                               \
    "  if not last then return nil end\n"                                                       \
    "  if idle(last) then forget(cid) return 'expired' end\n"                                   \
    "  return 'live'\n"                                                                         \
    "end\n"                                                                                     \
    "-- A live conversation written before positions and lifetimes (no 'mc'):\n"                \
    "-- give its turns positions, index its messages, count its lifetime from\n"                \
    "-- what is kept.  Once per conversation.\n"                                                \
    "local ROLE_BITS = {user = 1, assistant = 2, tool = 4, system = 8}\n"                       \
    "local function upgrade(cid)\n"                                                             \
    "  local ck = ckey(cid)\n"                                                                  \
    "  if redis.call('HEXISTS', ck, 'mc') == 1 then return end\n"                               \
    "  local lm, mc, tc, roles = '0', 0, 0, 0\n"                                                \
    "  for _, id in ipairs(redis.call('LRANGE', tkey(cid), 0, -1)) do\n"                        \
    "    local tk = turnkey(id)\n"                                                              \
    "    local t = redis.call('HMGET', tk, 'msgs', 'meta', 'pos', 'lens')\n"                    \
    "    if t[1] then\n"                                                                        \
    "      local ms = meta_of(t[2])\n"                                                          \
    "      if not t[3] then\n"                                                                  \
    "        local first = redis.call('INCRBY', POS, #ms) - #ms + 1\n"                          \
    "        redis.call('HSET', tk, 'pos', first)\n"                                            \
    "        redis.call('ZADD', TPOS, first, id)\n"                                             \
    "        for _, m in ipairs(ms) do redis.call('HSET', MSG, m[1], id) end\n"                 \
    "      end\n"                                                                               \
    "      if not t[4] then redis.call('HSET', tk, 'lens', split_lens(t[1])) end\n"             \
    "      tc, mc = tc + 1, mc + #ms\n"                                                         \
    "      for _, m in ipairs(ms) do\n"                                                         \
    "        roles = bit.bor(roles, ROLE_BITS[m[2]] or 0)\n"                                    \
    "        lm = m[3]\n"                                                                       \
    "      end\n"                                                                               \
    "    end\n"                                                                                 \
    "  end\n"                                                                                   \
    "  redis.call('HSET', ck, 'lm', lm, 'mc', mc, 'tc', tc, 'roles', roles)\n"                  \
    "end\n"                                                                                     \
    "-- a turn as a table: cid, pos (of its first message), msgs, ms (meta_of),\n"              \
    "-- off/len (each message's place in msgs); nil when gone\n"                                \
    "local function read_turn(tid)\n"                                                           \
    "  local h = redis.call('HMGET', turnkey(tid), 'cid', 'pos', 'msgs', 'meta', 'lens')\n"     \
    "  if not h[1] then return nil end\n"                                                       \
    "  local t = {cid = h[1], pos = tonumber(h[2]) or 0, msgs = h[3], ms = meta_of(h[4]),\n"    \
    "             off = {}, len = {}}\n"                                                        \
    "  local offset = 1\n"                                                                      \
    "  for l in string.gmatch(h[5] or split_lens(h[3]), '%d+') do\n"                            \
    "    t.off[#t.off + 1], t.len[#t.len + 1] = offset, tonumber(l)\n"                          \
    "    offset = offset + tonumber(l) + 1\n"                                                   \
    "  end\n"                                                                                   \
    "  return t\n"                                                                              \
    "end\n"                                                                                     \
    "-- {id, persona, iface} of a live conversation, or nil (no writes)\n"                      \
    "local function live_conv(cid)\n"                                                           \
    "  local h = redis.call('HMGET', ckey(cid), 'id', 'persona', 'iface', 'last_used')\n"       \
    "  if not h[4] or idle(h[4]) then return nil end\n"                                         \
    "  return {h[1], h[2] or '', h[3] or ''}\n"                                                 \
    "end\n"                                                                                     \
    "-- message i of turn t: {position, id, turn id, role, created, json,\n"                    \
    "-- interface message id, metadata, conversation id, persona, interface}\n"                 \
    "local function message_of(tid, t, i, conv)\n"                                              \
    "  local x = redis.call('HMGET', turnkey(tid), 'imid:' .. (i - 1), 'md:' .. (i - 1))\n"     \
    "  local m = t.ms[i]\n"                                                                     \
    "  return {t.pos + i - 1, m[1], tid, m[2], m[3],\n"                                         \
    "          string.sub(t.msgs, t.off[i], t.off[i] + t.len[i] - 1), x[1] or '', x[2] or '',\n" \
    "          conv[1], conv[2], conv[3]}\n"                                                    \
    "end\n"


/* ARGV[4] = CID, ARGV[5] = last N turns (0 = all).
 * -> {expired 0/1, nmessages, "m1,m2,...,", "n:tokens," per turn (0: unknown)} */
#define REDIS_LUA_LOAD                                                                         \
    "local cid, last = ARGV[4], tonumber(ARGV[5])\n"                                            \
    "local st = state(cid)\n"                                                                   \
    "if st ~= 'live' then return {st == 'expired' and 1 or 0, 0, ''} end\n"                     \
    "local ids = redis.call('LRANGE', tkey(cid), last > 0 and -last or 0, -1)\n"                \
    "local parts, sizes, count = {}, {}, 0\n"                                                   \
    "for _, id in ipairs(ids) do\n"                                                             \
    "  local t = redis.call('HMGET', turnkey(id), 'n', 'msgs', 'tok')\n"                        \
    "  if t[1] then\n"                                                                          \
    "    count = count + tonumber(t[1])\n"                                                      \
    "    parts[#parts + 1] = t[2]\n"                                                            \
    "    parts[#parts + 1] = ','\n"                                                             \
    "    sizes[#sizes + 1] = t[1] .. ':' .. (t[3] or '0') .. ','\n"                             \
    "  end\n"                                                                                   \
    "end\n"                                                                                     \
    "return {0, count, table.concat(parts), table.concat(sizes)}\n"


/* ARGV[4] = CID, 5 = conversation id, 6 = persona, 7 = interface, 8 = turn id,
 * 9 = started, 10 = finished, 11 = n, 12 = msgs, 13 = meta, 14 = keep turns
 * (0 = all), 15 = max conversations, 16 = TTL ms (0 = none), 17 = lease token
 * ("" = no lease: no fencing), 18 = lens, 19 = the turn's STORE_ROLE_* bits,
 * 20 = its last message's created ms, 21 = per message "LEN:interface message
 * id" and "LEN:metadata" ("" when no message has either), 22 = "1" when 23
 * is the conversation's new context record, 24 = the turn's size in tokens
 * (0: unknown, not kept).
 * -> {appended 0/1, evicted, expired}, or the error "LEASE ..." when the
 *    lease on CID is no longer ours (nothing written).  A committed turn
 *    gives its lease back here: one round trip less per turn. */
#define REDIS_LUA_APPEND                                                                       \
    "local cid, tid = ARGV[4], ARGV[8]\n"                                                       \
    "local keep, maxc, ttl, token = tonumber(ARGV[14]), tonumber(ARGV[15]),\n"                  \
    "  tonumber(ARGV[16]), ARGV[17]\n"                                                          \
    "local lease = P .. 'lease:' .. cid\n"                                                      \
    "local ours = token ~= '' and redis.call('GET', lease) == token\n"                          \
    "if redis.call('EXISTS', turnkey(tid)) == 1 then\n"                                         \
    "  if ours then redis.call('DEL', lease) end\n"                                             \
    "  return {0, 0, 0}\n"                                                                      \
    "end\n"                                                                                     \
    "if token ~= '' and not ours then\n"                                                        \
    "  return redis.error_reply('LEASE the conversation lease expired and was taken over')\n"   \
    "end\n"                                                                                     \
    "local evicted, expired = 0, 0\n"                                                           \
    "local st = state(cid)\n"                                                                   \
    "if st == 'expired' then expired = 1 end\n"                                                 \
    "if st == nil then forget(cid) end -- leftovers of keys dropped by TTL\n"                   \
    "local ck, tk, tt = ckey(cid), tkey(cid), turnkey(tid)\n"                                   \
    "if st ~= 'live' then\n"                                                                    \
    "  redis.call('HSET', ck, 'id', ARGV[5], 'persona', ARGV[6], 'iface', ARGV[7],\n"           \
    "             'created', ARGV[2], 'bytes', 0, 'lm', 0, 'mc', 0, 'tc', 0, 'roles', 0)\n"     \
    "else\n"                                                                                    \
    "  upgrade(cid)\n"                                                                          \
    "end\n"                                                                                     \
    "redis.call('HSET', ck, 'last_used', ARGV[2])\n"                                            \
    "if ARGV[22] == '1' then redis.call('HSET', ck, 'ctx', ARGV[23]) end\n"                     \
    "local ms = meta_of(ARGV[13])\n"                                                            \
    "local first = redis.call('INCRBY', POS, #ms) - #ms + 1\n"                                  \
    "redis.call('HSET', tt, 'cid', cid, 'started', ARGV[9], 'finished', ARGV[10],\n"            \
    "           'n', ARGV[11], 'msgs', ARGV[12], 'meta', ARGV[13], 'lens', ARGV[18], 'pos', first)\n" \
    "if ARGV[24] ~= '0' then redis.call('HSET', tt, 'tok', ARGV[24]) end\n"                     \
    "redis.call('ZADD', TPOS, first, tid)\n"                                                    \
    "for _, m in ipairs(ms) do redis.call('HSET', MSG, m[1], tid) end\n"                        \
    "-- per message \"LEN:interface message id\" then \"LEN:metadata\"\n"                       \
    "local x, p, i = ARGV[21], 1, 0\n"                                                          \
    "while p <= #x do\n"                                                                        \
    "  local fields = {}\n"                                                                     \
    "  for f = 1, 2 do\n"                                                                       \
    "    local colon = string.find(x, ':', p, true)\n"                                          \
    "    local n = tonumber(string.sub(x, p, colon - 1))\n"                                     \
    "    fields[f] = string.sub(x, colon + 1, colon + n)\n"                                     \
    "    p = colon + n + 1\n"                                                                   \
    "  end\n"                                                                                   \
    "  if fields[1] ~= '' then\n"                                                               \
    "    redis.call('HSET', tt, 'imid:' .. i, fields[1])\n"                                     \
    "    redis.call('HSET', imkey(cid), fields[1], tid .. ' ' .. i)\n"                          \
    "  end\n"                                                                                   \
    "  if fields[2] ~= '' then redis.call('HSET', tt, 'md:' .. i, fields[2]) end\n"             \
    "  i = i + 1\n"                                                                             \
    "end\n"                                                                                     \
    "redis.call('HINCRBY', ck, 'mc', #ms)\n"                                                    \
    "redis.call('HINCRBY', ck, 'tc', 1)\n"                                                      \
    "redis.call('HSET', ck, 'lm', ARGV[20], 'roles',\n"                                         \
    "           bit.bor(tonumber(redis.call('HGET', ck, 'roles')) or 0, tonumber(ARGV[19])))\n" \
    "redis.call('RPUSH', tk, tid)\n"                                                            \
    "redis.call('HINCRBY', ck, 'bytes', #ARGV[12])\n"                                           \
    "local trimmed = 0\n"                                                                       \
    "while keep > 0 and redis.call('LLEN', tk) > keep do\n"                                     \
    "  trimmed = trimmed + 1\n"                                                                 \
    "  local old = redis.call('LPOP', tk)\n"                                                    \
    "  redis.call('HINCRBY', ck, 'bytes', -redis.call('HSTRLEN', turnkey(old), 'msgs'))\n"      \
    "  drop_turn(old)\n"                                                                        \
    "end\n"                                                                                     \
    "redis.call('ZADD', LRU, redis.call('INCR', P .. 'seq'), cid)\n"                            \
    "while redis.call('ZCARD', LRU) > maxc do\n"                                                \
    "  local victim = redis.call('ZRANGE', LRU, 0, 0)[1]\n"                                     \
    "  if victim == cid then break end\n"                                                       \
    "  local last = redis.call('HGET', ckey(victim), 'last_used')\n"                            \
    "  if not last or idle(last) then expired = expired + 1 else evicted = evicted + 1 end\n"   \
    "  forget(victim)\n"                                                                        \
    "end\n"                                                                                     \
    "if ttl > 0 then\n"                                                                         \
    "  redis.call('PEXPIRE', ck, ttl)\n"                                                        \
    "  redis.call('PEXPIRE', tk, ttl)\n"                                                        \
    "  redis.call('PEXPIRE', imkey(cid), ttl)\n"                                                \
    "  for _, id in ipairs(redis.call('LRANGE', tk, 0, -1)) do\n"                               \
    "    redis.call('PEXPIRE', turnkey(id), ttl)\n"                                             \
    "  end\n"                                                                                   \
    "end\n"                                                                                     \
    "if ours then redis.call('DEL', lease) end\n"                                               \
    "return {1, evicted, expired, trimmed}\n"


/* ARGV[4] = CID.
 * -> {0} unknown, {1} expired now, or {2, id, created, last_used, lm, mc, tc,
 *    roles, {tid, started, finished, msgs, tokens or nil}...} */
#define REDIS_LUA_GET_CONVERSATION                                                             \
    "local cid = ARGV[4]\n"                                                                     \
    "local st = state(cid)\n"                                                                   \
    "if st ~= 'live' then return {st == 'expired' and 1 or 0} end\n"                            \
    "upgrade(cid)\n"                                                                            \
    "local c = redis.call('HMGET', ckey(cid), 'id', 'created', 'last_used', 'lm', 'mc', 'tc', 'roles')\n" \
    "local out = {2, c[1], c[2], c[3], c[4], c[5], c[6], c[7]}\n"                               \
    "for _, id in ipairs(redis.call('LRANGE', tkey(cid), 0, -1)) do\n"                          \
    "  local t = redis.call('HMGET', turnkey(id), 'started', 'finished', 'msgs', 'tok')\n"      \
    "  if t[1] then out[#out + 1] = {id, t[1], t[2], t[3], t[4]} end\n"                         \
    "end\n"                                                                                     \
    "return out\n"


/* ARGV[4] = turn id.
 * -> {0} unknown, {1} its conversation expired now, or {2, conversation id,
 *    started, finished, msgs, tokens or nil} */
#define REDIS_LUA_GET_TURN                                                                     \
    "local t = redis.call('HMGET', turnkey(ARGV[4]), 'cid', 'started', 'finished', 'msgs',\n"   \
    "                     'tok')\n"                                                            \
    "if not t[1] then return {0} end\n"                                                        \
    "local st = state(t[1])\n"                                                                 \
    "if st ~= 'live' then return {st == 'expired' and 1 or 0} end\n"                           \
    "return {2, redis.call('HGET', ckey(t[1]), 'id'), t[2], t[3], t[4], t[5]}\n"

/* -> {expired, {id, created, last_used, nturns, persona, iface, lm, mc, tc,
 *    roles}...} most recently used first */
#define REDIS_LUA_LIST                                                                         \
    "local out, expired = {0}, 0\n"                                                             \
    "for _, cid in ipairs(redis.call('ZREVRANGE', LRU, 0, -1)) do\n"                            \
    "  local st = state(cid)\n"                                                                 \
    "  if st == 'live' then\n"                                                                  \
    "    upgrade(cid)\n"                                                                        \
    "    local c = redis.call('HMGET', ckey(cid), 'id', 'created', 'last_used', 'persona', 'iface',\n" \
    "                         'lm', 'mc', 'tc', 'roles')\n"                                     \
    "    out[#out + 1] = {c[1], c[2], c[3], redis.call('LLEN', tkey(cid)), c[4] or '', c[5] or '',\n" \
    "                     c[6], c[7], c[8], c[9]}\n"                                            \
    "  else\n"                                                                                  \
    "    if st == nil then forget(cid) end\n"                                                   \
    "    expired = expired + 1\n"                                                               \
    "  end\n"                                                                                   \
    "end\n"                                                                                     \
    "out[1] = expired\n"                                                                        \
    "return out\n"


/* ARGV[4] = CID, or "" for every conversation.  -> how many were forgotten */
#define REDIS_LUA_FORGET                                                                       \
    "local cid = ARGV[4]\n"                                                                     \
    "if cid ~= '' then\n"                                                                       \
    "  local known = redis.call('EXISTS', ckey(cid)) == 1\n"                                    \
    "  forget(cid)\n"                                                                           \
    "  return known and 1 or 0\n"                                                               \
    "end\n"                                                                                     \
    "local all = redis.call('ZRANGE', LRU, 0, -1)\n"                                            \
    "for _, c in ipairs(all) do forget(c) end\n"                                                \
    "redis.call('DEL', TPOS, MSG, P .. 'gc') -- and what keys dropped by TTL left there\n"      \
    "return #all\n"


/* -> how many conversations were idle past the timeout (and are now forgotten) */
#define REDIS_LUA_EXPIRE                                                                       \
    "local n = 0\n"                                                                             \
    "for _, cid in ipairs(redis.call('ZRANGE', LRU, 0, -1)) do\n"                               \
    "  local st = state(cid)\n"                                                                 \
    "  if st ~= 'live' then\n"                                                                  \
    "    if st == nil then forget(cid) end\n"                                                   \
    "    n = n + 1\n"                                                                           \
    "  end\n"                                                                                   \
    "end\n"                                                                                     \
    "-- A slice of the message index, resumed where the last sweep stopped:\n"                  \
    "-- entries whose turn Redis dropped by its TTL go.\n"                                      \
    "local scan = redis.call('HSCAN', MSG, redis.call('GET', P .. 'gc') or '0', 'COUNT', 256)\n" \
    "for k = 1, #scan[2], 2 do\n"                                                               \
    "  if redis.call('EXISTS', turnkey(scan[2][k + 1])) == 0 then\n"                            \
    "    redis.call('HDEL', MSG, scan[2][k])\n"                                                 \
    "    redis.call('ZREM', TPOS, scan[2][k + 1])\n"                                            \
    "  end\n"                                                                                   \
    "end\n"                                                                                     \
    "redis.call('SET', P .. 'gc', scan[1])\n"                                                   \
    "return n\n"



/* -> {conversations, turns, message bytes, messages} (read only: like the memory store,
 *    it counts conversations idle but not yet forgotten; messages: P msg's entries) */
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
    "return {nc, nt, nb, redis.call('HLEN', P .. 'msg')}\n"

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

/* ---- queries (store.h version 3) ----
 * A query runs as several script calls, each bounded (ARGV[8] turns), the C
 * side continuing from the position the last one reached, so a query over a
 * big store never holds Redis for long.  Common arguments: ARGV[5] = "1"
 * newest first, 6 = the cursor position (0 = from the start), 7 = how many
 * matches to return at most, 8 = how many turns to read at most, 9 = role
 * ("" = any), 10 = since ms, 11 = until ms, 12 = the search text in lower
 * case when it is plain ASCII ("" = no prefilter: the C side checks every
 * match against store_json_content_matches anyway).
 * -> {done 0/1, the position reached, expired, message...} where message =
 *    {position, id, turn id, role, created, json, interface message id,
 *    metadata, conversation id, persona, interface} */
#define REDIS_LUA_QUERY_COMMON                                                                 \
    "local newest, after_s = ARGV[5] == '1', ARGV[6]\n"                                         \
    "local after, want, budget = tonumber(after_s), tonumber(ARGV[7]), tonumber(ARGV[8])\n"     \
    "local role, since, till, needle = ARGV[9], tonumber(ARGV[10]), tonumber(ARGV[11]), ARGV[12]\n" \
    "local found, scanned = {}, after\n"                                                        \
    "local function beyond(pos)\n"                                                              \
    "  return after == 0 or (newest and pos < after) or (not newest and pos > after)\n"         \
    "end\n"                                                                                     \
    "-- A turn none of whose messages is shown: the cursor still moves past it.\n"              \
    "local function pass(first, n)\n"                                                           \
    "  local edge = newest and first or first + n - 1\n"                                        \
    "  if beyond(edge) then scanned = edge end\n"                                               \
    "end\n"                                                                                     \
    "-- Offer turn t's messages beyond the cursor, in order; true once `want` matched.\n"       \
    "local function offer(tid, t, conv)\n"                                                      \
    "  local n = #t.ms\n"                                                                       \
    "  for k = 1, n do\n"                                                                       \
    "    local i = newest and n + 1 - k or k\n"                                                 \
    "    local pos = t.pos + i - 1\n"                                                           \
    "    if beyond(pos) then\n"                                                                 \
    "      scanned = pos\n"                                                                     \
    "      local m = t.ms[i]\n"                                                                 \
    "      local created = tonumber(m[3])\n"                                                    \
    "      if (role == '' or m[2] == role) and created >= since and (not till or created <= till) then\n" \
    "        local json = string.sub(t.msgs, t.off[i], t.off[i] + t.len[i] - 1)\n"              \
    "        if needle == '' or string.find(json, '\\\\u', 1, true) or\n"                       \
    "           string.find(string.lower(json), needle, 1, true) then\n"                        \
    "          found[#found + 1] = message_of(tid, t, i, conv)\n"                               \
    "          if #found >= want then return true end\n"                                        \
    "        end\n"                                                                             \
    "      end\n"                                                                               \
    "    end\n"                                                                                 \
    "  end\n"                                                                                   \
    "  return false\n"                                                                          \
    "end\n"                                                                                     \
    "-- Turn `id`, if accept(its CID) gives its conversation ({id, persona, iface}):\n"         \
    "-- true once `want` matched, false otherwise, nil when the turn is gone.  A\n"             \
    "-- turn of another conversation is passed without reading its text, one\n"                 \
    "-- whose text lacks the search word at one look, unparsed.\n"                              \
    "local function visit(id, accept)\n"                                                        \
    "  local h = redis.call('HMGET', turnkey(id), 'cid', 'pos', 'n')\n"                         \
    "  if not h[1] then return nil end\n"                                                       \
    "  local conv = accept(h[1])\n"                                                             \
    "  if conv and needle ~= '' then\n"                                                         \
    "    local msgs = redis.call('HGET', turnkey(id), 'msgs')\n"                                \
    "    if not string.find(msgs, '\\\\u', 1, true) and\n"                                      \
    "       not string.find(string.lower(msgs), needle, 1, true) then\n"                        \
    "      conv = false\n"                                                                      \
    "    end\n"                                                                                 \
    "  end\n"                                                                                   \
    "  if not conv then\n"                                                                      \
    "    pass(tonumber(h[2]) or 0, tonumber(h[3]) or 0)\n"                                      \
    "    return false\n"                                                                        \
    "  end\n"                                                                                   \
    "  return offer(id, read_turn(id), conv)\n"                                                 \
    "end\n"                                                                                     \
    "local function reply(done, expired)\n"                                                     \
    "  local out = {done and 1 or 0, scanned, expired}\n"                                       \
    "  for _, m in ipairs(found) do out[#out + 1] = m end\n"                                    \
    "  return out\n"                                                                            \
    "end\n"


/* One conversation: ARGV[4] = CID.  Walks its turn list from a binary search. */
#define REDIS_LUA_QUERY_CONVERSATION                                                           \
    "local cid = ARGV[4]\n"                                                                     \
    "local st = state(cid)\n"                                                                   \
    "if st ~= 'live' then return reply(true, st == 'expired' and 1 or 0) end\n"                 \
    "upgrade(cid)\n"                                                                            \
    "local conv, tk = live_conv(cid), tkey(cid)\n"                                              \
    "local len = redis.call('LLEN', tk)\n"                                                      \
    "-- Binary search (turns are in position order): ascending, the first turn\n"               \
    "-- with a message beyond the cursor; descending, the first turn at or past it.\n"          \
    "local lo, hi = 0, len\n"                                                                   \
    "while lo < hi do\n"                                                                        \
    "  local mid = math.floor((lo + hi) / 2)\n"                                                 \
    "  local h = redis.call('HMGET', turnkey(redis.call('LINDEX', tk, mid)), 'pos', 'n')\n"     \
    "  local pos, n = tonumber(h[1]) or 0, tonumber(h[2]) or 0\n"                               \
    "  local right\n"                                                                           \
    "  if newest then right = after ~= 0 and pos >= after else right = pos + n - 1 > after end\n" \
    "  if right then hi = mid else lo = mid + 1 end\n"                                          \
    "end\n"                                                                                     \
    "local ids\n"                                                                               \
    "if newest then\n"                                                                          \
    "  ids = lo > 0 and redis.call('LRANGE', tk, math.max(0, lo - budget), lo - 1) or {}\n"     \
    "else\n"                                                                                    \
    "  ids = redis.call('LRANGE', tk, lo, lo + budget - 1)\n"                                   \
    "end\n"                                                                                     \
    "local complete = newest and lo <= budget or (not newest and lo + budget >= len)\n"         \
    "local function accept() return conv end\n"                                                 \
    "for k = 1, #ids do\n"                                                                      \
    "  if visit(ids[newest and #ids + 1 - k or k], accept) then return reply(false, 0) end\n"   \
    "end\n"                                                                                     \
    "return reply(complete, 0)\n"


/* Every conversation: walks P tpos.  ARGV[13]/[14] = "1" and the conversation
 * id to match, [15]/[16] the persona, [17]/[18] the interface ("0" = any). */
#define REDIS_LUA_QUERY_ALL                                                                    \
    "local convs = {}\n"                                                                        \
    "-- the conversation of a turn when it is live and passes the filters, else false\n"        \
    "local function conv_for(cid)\n"                                                            \
    "  local c = convs[cid]\n"                                                                  \
    "  if c == nil then\n"                                                                      \
    "    c = live_conv(cid) or false\n"                                                         \
    "    if c and ((ARGV[13] == '1' and c[1] ~= ARGV[14]) or (ARGV[15] == '1' and c[2] ~= ARGV[16]) or\n" \
    "              (ARGV[17] == '1' and c[3] ~= ARGV[18])) then\n"                              \
    "      c = false\n"                                                                         \
    "    end\n"                                                                                 \
    "    convs[cid] = c\n"                                                                      \
    "  end\n"                                                                                   \
    "  return c\n"                                                                              \
    "end\n"                                                                                     \
    "local got\n"                                                                               \
    "if newest then\n"                                                                          \
    "  got = redis.call('ZREVRANGEBYSCORE', TPOS, after == 0 and '+inf' or '(' .. after_s, '-inf',\n" \
    "                   'WITHSCORES', 'LIMIT', 0, budget)\n"                                    \
    "else\n"                                                                                    \
    "  got = redis.call('ZRANGEBYSCORE', TPOS, '(' .. after_s, '+inf', 'WITHSCORES', 'LIMIT', 0, budget)\n" \
    "end\n"                                                                                     \
    "local complete = #got / 2 < budget\n"                                                      \
    "if not newest and after > 0 then -- the turn holding the cursor may have more beyond it\n" \
    "  local holder = redis.call('ZREVRANGEBYSCORE', TPOS, after_s, '-inf', 'WITHSCORES', 'LIMIT', 0, 1)\n" \
    "  if holder[1] then\n"                                                                     \
    "    table.insert(got, 1, holder[2])\n"                                                     \
    "    table.insert(got, 1, holder[1])\n"                                                     \
    "  end\n"                                                                                   \
    "end\n"                                                                                     \
    "for k = 1, #got, 2 do\n"                                                                   \
    "  local done = visit(got[k], conv_for)\n"                                                  \
    "  if done then return reply(false, 0) end\n"                                               \
    "  if done == nil then -- its conversation went by TTL\n"                                   \
    "    redis.call('ZREM', TPOS, got[k])\n"                                                    \
    "    pass(tonumber(got[k + 1]), 1)\n"                                                       \
    "  end\n"                                                                                   \
    "end\n"                                                                                     \
    "return reply(complete, 0)\n"


/* ARGV[4] = message id.  -> {0} unknown, {1} expired now, {2, message} */
#define REDIS_LUA_GET_MESSAGE                                                                  \
    "local mid = ARGV[4]\n"                                                                     \
    "local tid = redis.call('HGET', MSG, mid)\n"                                                \
    "if not tid then return {0} end\n"                                                          \
    "local t = read_turn(tid)\n"                                                                \
    "if not t then\n"                                                                           \
    "  redis.call('HDEL', MSG, mid) -- its turn went by TTL\n"                                  \
    "  return {0}\n"                                                                            \
    "end\n"                                                                                     \
    "local st = state(t.cid)\n"                                                                 \
    "if st ~= 'live' then return {st == 'expired' and 1 or 0} end\n"                            \
    "for i, m in ipairs(t.ms) do\n"                                                             \
    "  if m[1] == mid then return {2, message_of(tid, t, i, live_conv(t.cid))} end\n"           \
    "end\n"                                                                                     \
    "return {0}\n"


/* ---- message identity (store.h version 4) ---- */

#define REDIS_LUA_FIND_IMID                                                                    \
    "-- The turn id and message number (1-based) of conversation cid's newest\n"                \
    "-- message whose interface id is imid, or nil.  The index entry is checked;\n"             \
    "-- one left stale (its message got another id since) is looked up again.\n"                \
    "local function find_imid(cid, imid)\n"                                                     \
    "  local ik = imkey(cid)\n"                                                                 \
    "  local entry = redis.call('HGET', ik, imid)\n"                                            \
    "  if not entry then return nil end\n"                                                      \
    "  local tid, i = string.match(entry, '^(.*) (%d+)$')\n"                                    \
    "  if tid then\n"                                                                           \
    "    local h = redis.call('HMGET', turnkey(tid), 'cid', 'imid:' .. i)\n"                    \
    "    if h[1] == cid and h[2] == imid then return tid, tonumber(i) + 1 end\n"                \
    "  end\n"                                                                                   \
    "  local ids = redis.call('LRANGE', tkey(cid), 0, -1)\n"                                    \
    "  for k = #ids, 1, -1 do\n"                                                                \
    "    local n = tonumber(redis.call('HGET', turnkey(ids[k]), 'n')) or 0\n"                   \
    "    for j = n, 1, -1 do\n"                                                                 \
    "      if redis.call('HGET', turnkey(ids[k]), 'imid:' .. (j - 1)) == imid then\n"           \
    "        redis.call('HSET', ik, imid, ids[k] .. ' ' .. (j - 1))\n"                          \
    "        return ids[k], j\n"                                                                \
    "      end\n"                                                                               \
    "    end\n"                                                                                 \
    "  end\n"                                                                                   \
    "  redis.call('HDEL', ik, imid)\n"                                                          \
    "  return nil\n"                                                                            \
    "end\n"


/* ARGV[4] = CID, 5 = interface message id.  -> {0}, {1} expired now, {2, message} */
#define REDIS_LUA_FIND_MESSAGE                                                                 \
    "local cid = ARGV[4]\n"                                                                     \
    "local st = state(cid)\n"                                                                   \
    "if st ~= 'live' then return {st == 'expired' and 1 or 0} end\n"                            \
    "local tid, i = find_imid(cid, ARGV[5])\n"                                                  \
    "if not tid then return {0} end\n"                                                          \
    "return {2, message_of(tid, read_turn(tid), i, live_conv(cid))}\n"


/* ARGV[4] = CID, 5 = turn id ("" = by 6), 6 = interface message id, 7 = window
 * turns (0 = all).  -> {0}, {1} expired now, {2, turn id, 1} in the window, or
 * {2, turn id, 0, nmessages, msgs} */
#define REDIS_LUA_LOAD_TURN                                                                    \
    "local cid, tid, window = ARGV[4], ARGV[5], tonumber(ARGV[7])\n"                            \
    "local st = state(cid)\n"                                                                   \
    "if st ~= 'live' then return {st == 'expired' and 1 or 0} end\n"                            \
    "if tid == '' then\n"                                                                       \
    "  tid = find_imid(cid, ARGV[6])\n"                                                         \
    "  if not tid then return {0} end\n"                                                        \
    "end\n"                                                                                     \
    "local h = redis.call('HMGET', turnkey(tid), 'cid', 'n', 'msgs')\n"                         \
    "if h[1] ~= cid then return {0} end\n"                                                      \
    "local tk = tkey(cid)\n"                                                                    \
    "local at = redis.call('LPOS', tk, tid)\n"                                                  \
    "if not at then return {0} end\n"                                                           \
    "if window == 0 or at >= redis.call('LLEN', tk) - window then return {2, tid, 1} end\n"     \
    "return {2, tid, 0, tonumber(h[2]), h[3]}\n"


/* ARGV[4] = turn id, 5 = interface message id, 6 = TTL ms (0 = none).
 * -> {0}, {1} expired now, or {2, the message id it was set on} */
#define REDIS_LUA_SET_INTERFACE_ID                                                             \
    "local tid, imid, ttl = ARGV[4], ARGV[5], tonumber(ARGV[6])\n"                              \
    "local t = read_turn(tid)\n"                                                                \
    "if not t then return {0} end\n"                                                            \
    "local st = state(t.cid)\n"                                                                 \
    "if st ~= 'live' then return {st == 'expired' and 1 or 0} end\n"                            \
    "local i = #t.ms -- the final answer: the last assistant message, else the last\n"          \
    "for k = #t.ms, 1, -1 do\n"                                                                 \
    "  if t.ms[k][2] == 'assistant' then i = k break end\n"                                     \
    "end\n"                                                                                     \
    "redis.call('HSET', turnkey(tid), 'imid:' .. (i - 1), imid)\n"                              \
    "-- the index keeps the newest message holding imid\n"                                      \
    "local ik = imkey(t.cid)\n"                                                                 \
    "local entry = redis.call('HGET', ik, imid)\n"                                              \
    "local other, j = string.match(entry or '', '^(.*) (%d+)$')\n"                              \
    "local newer = false\n"                                                                     \
    "if other then\n"                                                                           \
    "  local h = redis.call('HMGET', turnkey(other), 'pos', 'imid:' .. j)\n"                    \
    "  newer = h[2] == imid and tonumber(h[1]) + tonumber(j) > t.pos + i - 1\n"                 \
    "end\n"                                                                                     \
    "if not newer then redis.call('HSET', ik, imid, tid .. ' ' .. (i - 1)) end\n"               \
    "if ttl > 0 then redis.call('PEXPIRE', ik, ttl) end\n"                                      \
    "return {2, t.ms[i][1]}\n"


/* At open, a slice of conversations at a time: upgrade what was written
 * before positions and lifetimes.  ARGV[4] = the LRU score to start from
 * ("-inf", then what the last call returned), 5 = slice size.
 * -> {1, "", expired} done, or {0, next start, expired} */
#define REDIS_LUA_UPGRADE                                                                      \
    "if redis.call('EXISTS', P .. 'v4') == 1 then return {1, '', 0} end\n"                      \
    "local slice = tonumber(ARGV[5])\n"                                                         \
    "local got = redis.call('ZRANGEBYSCORE', LRU, ARGV[4], '+inf', 'WITHSCORES', 'LIMIT', 0, slice)\n" \
    "local expired, last = 0, ''\n"                                                             \
    "for k = 1, #got, 2 do\n"                                                                   \
    "  local st = state(got[k])\n"                                                              \
    "  if st == 'live' then\n"                                                                  \
    "    upgrade(got[k])\n"                                                                     \
    "  else\n"                                                                                  \
    "    if st == nil then forget(got[k]) end\n"                                                \
    "    expired = expired + 1\n"                                                               \
    "  end\n"                                                                                   \
    "  last = got[k + 1]\n"                                                                     \
    "end\n"                                                                                     \
    "if #got / 2 < slice then\n"                                                                \
    "  redis.call('SET', P .. 'v4', '1')\n"                                                     \
    "  return {1, '', expired}\n"                                                               \
    "end\n"                                                                                     \
    "return {0, '(' .. last, expired}\n"


/* ARGV[4] = CID.  -> {expired 0/1, the context record or "", lm, mc, tc, roles} */
#define REDIS_LUA_CONTEXT_GET                                                                  \
    "local cid = ARGV[4]\n"                                                                     \
    "local st = state(cid)\n"                                                                   \
    "if st ~= 'live' then return {st == 'expired' and 1 or 0, '', 0, 0, 0, 0} end\n"            \
    "local h = redis.call('HMGET', ckey(cid), 'ctx', 'lm', 'mc', 'tc', 'roles')\n"              \
    "return {0, h[1] or '', h[2] or 0, h[3] or 0, h[4] or 0, h[5] or 0}\n"

/* ARGV[4] = CID, 5 = the context record, 6 = "1" when 7 is the record expected.
 * -> 1 written, 0 no such live conversation, 2 the record is not the one expected */
#define REDIS_LUA_CONTEXT_SET                                                                  \
    "local cid = ARGV[4]\n"                                                                     \
    "if state(cid) ~= 'live' then return 0 end\n"                                               \
    "if ARGV[6] == '1' and (redis.call('HGET', ckey(cid), 'ctx') or '') ~= ARGV[7] then\n"      \
    "  return 2\n"                                                                              \
    "end\n"                                                                                     \
    "redis.call('HSET', ckey(cid), 'ctx', ARGV[5])\n"                                           \
    "return 1\n"


#endif
