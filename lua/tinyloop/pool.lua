-- tinyloop.pool - tl.PrefixPool: registered prefixes pinned in a model's
-- prefix cache (contract: docs/prefix-pool.md; API: lua/README.md).
local ffi = require "ffi"
local lib = require "tinyloop.lib"
local args = require "tinyloop.args"

local C = lib.load()
local ffi_new, ffi_gc = ffi.new, ffi.gc
local type, tonumber, error, setmetatable, getmetatable = type, tonumber, error, setmetatable, getmetatable
local format = string.format
local show, bad, raise_rc, opt_int = args.show, args.bad, args.raise_rc, args.opt_int

local _M = {}

-- Scratch cdata, allocated once (nothing yields between fill and read).
local pool_out = ffi_new("tl_pool *[1]")
local pstats_buf = ffi_new("tl_pool_stats[1]")


local Pool = {}
local pool_mt = { __index = Pool }
_M.mt = pool_mt


local function pool_handle(pool, fname, level)
    local h = pool.h
    if not h then
        error("tinyloop.PrefixPool is freed; cannot call " .. fname, level + 1)
    end
    return h
end


-- PrefixPool(capacity = 16): an empty pool; 0 is coerced to 1. Allocates
-- no KV: memory comes with register_prefix.
function _M.PrefixPool(capacity)
    capacity = opt_int("PrefixPool", "capacity", capacity, 16, 0, 2)
    local rc = C.tl_pool_new(capacity, pool_out)
    if rc ~= 0 then
        raise_rc(rc, "PrefixPool", 2)
    end
    local h = ffi_gc(pool_out[0], C.tl_pool_free)
    return setmetatable({ h = h }, pool_mt)
end


function Pool:size()
    return C.tl_pool_size(pool_handle(self, "size", 2))
end


function Pool:total_cached_tokens()
    return tonumber(C.tl_pool_total_cached_tokens(pool_handle(self, "total_cached_tokens", 2)))
end


function Pool:capacity()
    C.tl_pool_get_stats(pool_handle(self, "capacity", 2), pstats_buf)
    return pstats_buf[0].capacity
end


local POOL_POLICY = { shortest = 0, lru = 1, cost = 2 }
local POOL_POLICY_NAME = { [0] = "shortest", [1] = "lru", [2] = "cost" }

-- set_policy("shortest" | "lru" | "cost"): which entry a full pool drops.
function Pool:set_policy(policy)
    local h = pool_handle(self, "set_policy", 2)
    local p = POOL_POLICY[policy]
    if not p then
        bad("set_policy", "policy", "expected \"shortest\", \"lru\" or \"cost\", got " .. show(policy))
    end
    C.tl_pool_set_policy(h, p)
end


local POOL_SCOPE = { shared = 0, pool = 1 }

-- set_scope("shared" | "pool"): what a call through the pool may reuse:
-- the whole prefix cache (the default) or only this pool's entries.
function Pool:set_scope(scope)
    local h = pool_handle(self, "set_scope", 2)
    local s = POOL_SCOPE[scope]
    if not s then
        bad("set_scope", "scope", "expected \"shared\" or \"pool\", got " .. show(scope))
    end
    C.tl_pool_set_scope(h, s)
end


-- set_salt(salt), set_shareable(bool), set_tenant(id): the namespace, the
-- cross-salt sharing and the tenant charged for the pool's entries (set
-- before the first register).
function Pool:set_salt(salt)
    local h = pool_handle(self, "set_salt", 2)
    local rc = C.tl_pool_set_salt(h, opt_int("set_salt", "salt", salt, 0, 0, 2))
    if rc ~= 0 then
        raise_rc(rc, "set_salt", 2)
    end
end


function Pool:set_shareable(on)
    local h = pool_handle(self, "set_shareable", 2)
    local rc = C.tl_pool_set_shareable(h, on and 1 or 0)
    if rc ~= 0 then
        raise_rc(rc, "set_shareable", 2)
    end
end


function Pool:set_tenant(tenant)
    local h = pool_handle(self, "set_tenant", 2)
    local rc = C.tl_pool_set_tenant(h, opt_int("set_tenant", "tenant", tenant, 0, 0, 2))
    if rc ~= 0 then
        raise_rc(rc, "set_tenant", 2)
    end
end


function Pool:stats()
    C.tl_pool_get_stats(pool_handle(self, "stats", 2), pstats_buf)
    local s = pstats_buf[0]
    return {
        size = s.size, capacity = s.capacity, policy = POOL_POLICY_NAME[s.policy] or "shortest",
        total_cached_tokens = tonumber(s.total_cached_tokens), lookups = tonumber(s.lookups),
        hits = tonumber(s.hits), hit_tokens = tonumber(s.hit_tokens),
        registrations = tonumber(s.registrations), evictions = tonumber(s.evictions),
    }
end


-- free(): unpins every entry now (the GC would do it later). Idempotent.
function Pool:free()
    local h = self.h
    if h then
        self.h = nil
        ffi_gc(h, nil)
        C.tl_pool_free(h)
    end
end


function Pool:is_freed()
    return self.h == nil
end


pool_mt.__tostring = function(self)
    if not self.h then
        return "tinyloop.PrefixPool (freed)"
    end
    return format("tinyloop.PrefixPool (%d entries, %d tokens)", self:size(), self:total_cached_tokens())
end


local function is_pool(x)
    return type(x) == "table" and getmetatable(x) == pool_mt
end
_M.is_pool = is_pool
_M.handle = pool_handle
return _M
