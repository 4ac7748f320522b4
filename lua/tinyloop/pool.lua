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


-- ---- named entries and their KV cost -------------------------------------------------------
--
-- The C pool keys its entries by (tokens, loops, cache_window) and has no
-- names. register_prefix(pool, tokens, { name = ... }) labels the entry
-- here, on the Lua side, with what it costs in the model's KV mode, so
-- capacity planning ("how many of these fit in kv_mem?") works from the API.
-- A label is kept until the name is given to another entry or the pool is
-- freed; the C pool does not say which entry a full pool drops, so an entry
-- evicted since (stats().evictions) still reports the cost it had.
-- Closing the model forgets the labels (its entries are gone).

-- name_entry(pool, name, model, n_tokens, loops): called by
-- Model:register_prefix / register_prefix_async once the entry is in the
-- pool (or its build is queued). blocks: model:kv_blocks, the blocks a
-- sequence of n_tokens holds at that loop depth, each of the mode's block
-- size; bytes: blocks x the exact bytes of one block, with the blocks it
-- shares with other cached prefixes counted in full (the entry's own
-- footprint, not what registering it added).
function _M.name_entry(pool, name, model, n, loops)
    local blocks = model:kv_blocks(n, loops)
    local names = pool._names
    if not names then
        names = {}
        pool._names = names
        -- weak: a pool must not keep its model open
        pool._model_ref = setmetatable({}, { __mode = "v" })
    end
    pool._model_ref[1] = model
    names[name] = {
        n_tokens = n, loops = loops, kv_mode = model._kv_mode,
        blocks = blocks, bytes = blocks * model._kv_block_bytes,
    }
end


-- The labels, or nil once their model is closed (its entries are gone).
local function live_names(pool)
    local names = pool._names
    if not names then
        return nil
    end
    local m = pool._model_ref[1]
    if not m or m:is_closed() then
        pool._names, pool._model_ref = nil, nil
        return nil
    end
    return names
end


-- entry_bytes(name) -> bytes, blocks: the KV memory the entry registered
-- under name holds in the model's KV mode (exact: blocks x block bytes,
-- see name_entry). Raises naming the value for a name no entry has.
function Pool:entry_bytes(name)
    pool_handle(self, "entry_bytes", 2)
    if type(name) ~= "string" then
        bad("entry_bytes", "name", "expected a string, got " .. show(name))
    end
    local names = live_names(self)
    local e = names and names[name]
    if not e then
        bad("entry_bytes", "name", "no entry named " .. show(name) .. " in this pool")
    end
    return e.bytes, e.blocks
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
        self._names, self._model_ref = nil, nil
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
