-- Routing: prefix-aware with a load-balance fallback (SGLang's router
-- shape). The runtime fills each candidate with
--   id, load (running requests), queued, capacity, match (tokens of this
--   request the candidate holds: longest cached match or registered prefix)
-- and the request with tokens (ids) and tenant.
--
-- 1. If load is unbalanced -- max load - min load > BALANCE_ABS and
--    max > min * BALANCE_REL -- route to the least loaded candidate
--    (ties: the better match).
-- 2. Otherwise, if the best match covers at least CACHE_THRESHOLD of the
--    prompt, route there (ties: the less loaded).
-- 3. Otherwise the least loaded, ties broken by match then by a stable hash
--    of the tenant so a tenant's sessions keep landing on one candidate
--    (building a cache there instead of everywhere).
local CACHE_THRESHOLD = 0.5
local BALANCE_ABS = 32
local BALANCE_REL = 1.5

local P = { kind = "routing", version = "prefix-balance-1" }

local function load_of(c)
    return (c.load or 0) + (c.queued or 0)
end

local function hash(s)
    local h = 5381
    s = tostring(s or "")
    for i = 1, #s do
        h = (h * 33 + s:byte(i)) % 4294967296
    end
    return h
end

-- The candidate with the largest key(c), visiting cands from index
-- start + 1 round; the first of equal keys wins.
local function best_of(cands, n, start, key)
    local best, best_key
    for k = 0, n - 1 do
        local c = cands[(start + k) % n + 1]
        local v = key(c)
        if not best or v > best_key then
            best, best_key = c, v
        end
    end
    return best
end

function P.choose(req, cands)
    local n = #cands
    if n == 1 then
        return cands[1]
    end
    local lo, hi = math.huge, -math.huge
    for i = 1, n do
        local l = load_of(cands[i])
        lo, hi = math.min(lo, l), math.max(hi, l)
    end
    local len = req.tokens and #req.tokens or 0
    if hi - lo > BALANCE_ABS and hi > lo * BALANCE_REL then
        return best_of(cands, n, 0, function(c) return -load_of(c) * 1e9 + (c.match or 0) end)
    end
    local best = best_of(cands, n, 0, function(c) return (c.match or 0) * 1e6 - load_of(c) end)
    if len > 0 and (best.match or 0) >= CACHE_THRESHOLD * len then
        return best
    end
    return best_of(cands, n, hash(req.tenant) % n, function(c) return -load_of(c) * 1e6 + (c.match or 0) end)
end

function P.self_test()
    local a = { id = "a", load = 1, match = 90 }
    local b = { id = "b", load = 0, match = 0 }
    local toks = {}
    for i = 1, 100 do
        toks[i] = i
    end
    assert(P.choose({ tokens = toks }, { a, b }) == a, "a good match wins when load is even")
    local busy = { id = "busy", load = 500, match = 100 }
    local idle = { id = "idle", load = 0, match = 0 }
    assert(P.choose({ tokens = { 1 } }, { busy, idle }) == idle, "balance fallback")
end

return P
