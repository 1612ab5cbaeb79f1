"""What the Redis store keeps on the server: its key layout, and the Lua scripts that
change several keys in one atomic step.

Layout under the agent's key prefix (several agents can share one Redis):

    {prefix}{key}              the value, a plain string (``redis-cli GET`` works)
    {prefix}{key}              or, for a log such as karma, a Redis list (RPUSH: O(1))
    {prefix}__meta__:{key}     the metadata of a value, JSON, with the value's TTL
    {prefix}__lock__:{name}    a lease: SET NX PX with an owner token
    {prefix}__holds__:stats:daily_cost  today's spend held by calls in flight: a hash, token -> "USD DEADLINE_MS"
    {prefix}__due__            the agent's due index: a sorted set, key -> unix time (see brainstem.store.due)
    {prefix}__due_wake__       the agent's wake index, the same way
    __agents__                 the registry of agent names: a set, outside every prefix
    __due_agents__             the due index across agents: a sorted set, agent name ('' the default) -> the
                               time of its earliest entry, outside every prefix
    __due_wake_agents__        the wake index across agents, the same way

A script's keys are all the agent's, so on a Redis Cluster they share its hash slot
(see :mod:`brainstem.store.redis.store`) and the script stays legal there.
"""

from __future__ import annotations

META = "__meta__:"
LEASE = "__lock__:"
HOLDS = "__holds__:"
DUE = "__due__"
WAKE_DUE = "__due_wake__"
INTERNAL = (META, LEASE, HOLDS, DUE, WAKE_DUE)
REGISTRY = "__agents__"  # outside every prefix
DUE_AGENTS = "__due_agents__"  # outside every prefix
WAKE_DUE_AGENTS = "__due_wake_agents__"  # outside every prefix
# Each due index (brainstem.store.due.INDEXES): (the agent's sorted set under its prefix, the one across agents).
DUE_SETS = {"": (DUE, DUE_AGENTS), "wake": (WAKE_DUE, WAKE_DUE_AGENTS)}
DEFAULT_TAG = "__default__"  # the default agent's hash tag on a cluster (no agent name starts with "__")

# Compare-and-delete / compare-and-expire: only the owner may release or extend.
RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end"
RENEW = ("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) "
            "else return 0 end")
# A retried append: the first try may have landed before its connection dropped (a restart mid-reply).
APPEND_AGAIN = ("if redis.call('LINDEX', KEYS[1], -1) == ARGV[1] then return redis.call('LLEN', KEYS[1]) end "
                 "return redis.call('RPUSH', KEYS[1], ARGV[1])")

# An entry of an agent's due index and, in the same step, the agent's earliest entry in the index across
# agents. KEYS: the agent's index, and (not on a cluster, where it is another slot's) the index across agents;
# ARGV: the key, its time ('': remove it), the agent's name. The agent's earliest time ('': none).
SET_DUE = """
if ARGV[2] == '' then redis.call('ZREM', KEYS[1], ARGV[1]) else redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1]) end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if KEYS[2] then
  if first[2] then redis.call('ZADD', KEYS[2], first[2], ARGV[3]) else redis.call('ZREM', KEYS[2], ARGV[3]) end
end
return first[2] or ''
"""

# A fenced write (see :mod:`brainstem.store.fenced`): done only if the lease still names its owner,
# in one atomic step, so a session that lost its lease can never overwrite its successor's schedule.
# KEYS: the lease, the key, its metadata; ARGV: owner, op (put | del | append | append_again | incr | dellog
# | trim), value (the amount, the entries to keep), PX (0: none), metadata ('' : none). -1: the lease is not
# the owner's.
FENCED = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local op = ARGV[2]
local function set(key, value)
  if ARGV[4] ~= '0' then redis.call('SET', key, value, 'PX', ARGV[4]) else redis.call('SET', key, value) end
end
if op == 'put' then
  set(KEYS[2], ARGV[3])
  if ARGV[5] ~= '' then
    set(KEYS[3], ARGV[5])
  else
    redis.call('DEL', KEYS[3])
  end
  return 1
elseif op == 'del' then
  if redis.call('TYPE', KEYS[2]).ok == 'list' then return 0 end
  local n = redis.call('DEL', KEYS[2])
  redis.call('DEL', KEYS[3])
  return n
end
if op == 'incr' then return redis.call('INCRBY', KEYS[2], ARGV[3]) end
if op == 'dellog' then
  if redis.call('TYPE', KEYS[2]).ok ~= 'list' then return 0 end
  return redis.call('DEL', KEYS[2])
end
if op == 'trim' then
  if tonumber(ARGV[3]) > 0 then redis.call('LTRIM', KEYS[2], -tonumber(ARGV[3]), -1) else redis.call('DEL', KEYS[2]) end
  return 1
end
if op == 'append_again' and redis.call('LINDEX', KEYS[2], -1) == ARGV[3] then return redis.call('LLEN', KEYS[2]) end
return redis.call('RPUSH', KEYS[2], ARGV[3])
"""

# Today's spend (see ``Store.reserve_spend``). KEYS: the spend value (JSON {"date", "usd"}), its holds
# (a hash, token -> "USD DEADLINE_MS"). Deadlines are the server's clock, so hosts whose clocks differ
# agree on when a hold has expired; expired holds are dropped by whoever looks next.
_SPEND_LIB = """
if redis.replicate_commands then pcall(redis.replicate_commands) end  -- TIME before writes (Redis < 5)
local function spent(day)
  local raw = redis.call('GET', KEYS[1])
  if not raw then return 0 end
  local ok, rec = pcall(cjson.decode, raw)
  if ok and type(rec) == 'table' and rec.date == day and type(rec.usd) == 'number' and rec.usd == rec.usd
     and rec.usd ~= math.huge and rec.usd ~= -math.huge then
    return rec.usd
  end
  return 0
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function held(now, drop)
  local total = 0
  local all = redis.call('HGETALL', KEYS[2])
  for i = 1, #all, 2 do
    local usd, deadline = string.match(all[i + 1], '^(%S+) (%S+)$')
    deadline = tonumber(deadline)
    if deadline == nil or deadline <= now then
      if drop then redis.call('HDEL', KEYS[2], all[i]) end
    elseif usd ~= 'S' then
      total = total + (tonumber(usd) or 0)
    end
  end
  return total
end
"""
# KEYS: the spend, its holds, the session's lease; ARGV: day, amount, ceiling, token, ttl_ms, the lease's
# owner ('': unfenced). 1: held; 0: it would pass the ceiling; -1: the lease is not the owner's.
RESERVE = _SPEND_LIB + """
if ARGV[6] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[6] then return -1 end  -- fenced: the lease is gone
local now = now_ms()
local amount = tonumber(ARGV[2])
local was = redis.call('HGET', KEYS[2], ARGV[4])
if was and string.sub(was, 1, 2) ~= 'S ' then return 1 end  -- a retry of a reserve that was done
if spent(ARGV[1]) + held(now, true) + amount > tonumber(ARGV[3]) + 1e-12 then return 0 end
local ttl = tonumber(ARGV[5])
redis.call('HSET', KEYS[2], ARGV[4], ARGV[2] .. ' ' .. string.format('%d', now + ttl))
if redis.call('PTTL', KEYS[2]) < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
return 1
"""
# ARGV: day, token ('': none), actual. The day's spend after, as text. A settled hold stays a minute as
# "S DEADLINE", counting nothing, so a settle retried after a lost reply is not added twice.
SETTLE = _SPEND_LIB + """
if ARGV[2] ~= '' then
  local was = redis.call('HGET', KEYS[2], ARGV[2])
  if was and string.sub(was, 1, 2) == 'S ' then return tostring(spent(ARGV[1])) end
  redis.call('HSET', KEYS[2], ARGV[2], 'S ' .. string.format('%d', now_ms() + 60000))
  if redis.call('PTTL', KEYS[2]) < 60000 then redis.call('PEXPIRE', KEYS[2], 60000) end
end
local total = spent(ARGV[1]) + tonumber(ARGV[3])
if total < 0 then total = 0 end
local text = string.format('%.10f', total):gsub('0+$', ''):gsub('%.$', '')
redis.call('SET', KEYS[1], '{"date":"' .. ARGV[1] .. '","usd":' .. text .. '}')
redis.call('DEL', KEYS[3])
return text
"""
# ARGV: day. {spent, held}, as text.
DAILY = _SPEND_LIB + """
return {tostring(spent(ARGV[1])), tostring(held(now_ms(), false))}
"""
