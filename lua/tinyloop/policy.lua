-- Hot-reloadable Lua policies (DESIGN.md "Policies"): routing, eviction and
-- tenant mapping as Lua files an operator edits while the engine runs.
--
-- A policy file returns a table { kind = "routing" | "eviction" | "tenants",
-- version = "...", <the kind's functions>, self_test = function() end }.
-- Loading compiles it with loadstring, runs it under setfenv in a
-- whitelisted environment (no io, os, require, ffi, debug, load*, setfenv,
-- getfenv, ngx, rawset, collectgarbage, coroutine; copies of string, table,
-- math, bit), checks the kind's contract, runs the policy's self_test and a
-- built-in check of the contract on sample inputs -- every step under an
-- instruction limit, a memory cap and a time budget (a debug count hook
-- owned by the runtime, JIT off for the policy's code so the hook fires,
-- bounded pattern functions and string builders; see .sandbox), with
-- plain data in and out -- and only then swaps the new version in. A file
-- that fails any step is rejected with a logged reason (file:line:
-- message) and the previous version keeps serving.
--
--   local policy = require "tinyloop.policy"
--   local rt = policy.Runtime{ path = "lua/policies/routing.lua", kind = "routing" }
--   local v = rt:acquire()          -- the version this request runs on
--   local c = v:call("choose", req, candidates)
--   rt:release(v)
--   rt:maybe_reload()               -- at request boundaries (every interval_ms at most)
--
-- Versions are immutable; a version acquired by a request stays usable after
-- a reload, and a runtime's on_retire(old) runs once no request holds it.
--
-- Modules: tinyloop.policy.sandbox (environment, guarded calls),
-- .contracts (per-kind checks and sample inputs), .apply (eviction weights
-- pushed into C, routing), .tenants (a tenants policy applied to a model:
-- prompts registered per version, salts, budgets, named versioned
-- prefixes), .shadow (shadow eviction simulator), .trace (synthetic
-- multi-tenant traces and replay). Defaults: lua/policies/*.lua.
local jit = require "jit"

local sandbox = require "tinyloop.policy.sandbox"
local contracts_m = require "tinyloop.policy.contracts"

local _M = {}

local type, pairs, tostring, error, pcall, select, next = type, pairs, tostring, error, pcall, select, next
local setmetatable = setmetatable
local format = string.format

_M.KINDS = { routing = true, eviction = true, tenants = true }
_M.DEFAULT_LIMIT = sandbox.DEFAULT_LIMIT
_M.LIMIT_MSG = sandbox.LIMIT_MSG
_M.new_env, _M.guarded = sandbox.new_env, sandbox.guarded
local guarded, plain, copy_in = sandbox.guarded, sandbox.plain, sandbox.copy_in
for k, v in pairs(contracts_m) do
    _M[k] = v
end
local contracts, deep_copy = contracts_m.contracts, contracts_m.deep_copy


-- ---- versions ------------------------------------------------------------------------------

local Version = {}
local fields_of = setmetatable({}, { __mode = "k" })    -- version proxy -> its fields
local version_mt = {
    __index = function(v, k)
        local f = fields_of[v]
        local x = f[k]
        if x ~= nil and k ~= "fns" and k ~= "data" then
            return x
        end
        return Version[k]
    end,
    __newindex = function(_, k)
        error("a policy version is immutable (tried to set " .. tostring(k) .. ")", 2)
    end,
    __tostring = function(v)
        local f = fields_of[v]
        return format("policy %s %s (#%d, %s)", f.kind, f.version, f.serial, f.name)
    end,
    __metatable = false,
}
_M.Version_mt = version_mt


function _M.is_version(x)
    return fields_of[x] ~= nil
end


local function plain_results(back, ok, ...)
    if not ok then
        return false, ...
    end
    local n = select("#", ...)
    local out = {}
    for i = 1, n do
        local r, why = plain((select(i, ...)), back)
        if why then
            return false, "policy returned " .. why .. " (results must be plain data)"
        end
        out[i] = r
    end
    return true, unpack(out, 1, n)
end


-- v:call(name, ...) -> ok, results... | false, message: the policy's
-- function, guarded. Arguments go in as copies without metatables; results
-- come out as plain data (a table the policy got as an argument comes back
-- as the caller's own table), and the message is a string.
function Version:call(name, ...)
    local fs = fields_of[self]
    local f = fs.fns[name]
    if type(f) ~= "function" then
        return false, "policy has no function " .. tostring(name)
    end
    local back, n = {}, select("#", ...)
    local args = { ... }
    for i = 1, n do
        args[i] = copy_in(args[i], back)
    end
    return plain_results(back, guarded(fs.limit, f, unpack(args, 1, n)))
end


-- v:get(key) -> a copy of a data field of the policy (weights, tenants...).
function Version:get(key)
    return deep_copy(fields_of[self].data[key])
end


function Version:has(name)
    local fs = fields_of[self]
    return fs.fns[name] ~= nil or fs.data[name] ~= nil
end


local function what(x)
    return type(x) == "string" and x or type(x)     -- never tostring() a policy's table in host code
end


local compile_checked

-- compile(src, name, opts) -> version or nil, reason. opts: kind (expected
-- kind; nil accepts any), limit, serial, log, load_ms (wall-clock budget of
-- the whole load: chunk, self_test and contract checks; sandbox.LOAD_MS).
function _M.compile(src, name, opts)
    opts = opts or {}
    name = name or "policy"
    return sandbox.within(opts.load_ms or sandbox.LOAD_MS, compile_checked, src, name, opts)
end


function compile_checked(src, name, opts)
    local limit = opts.limit or _M.DEFAULT_LIMIT
    if type(src) ~= "string" then
        return nil, name .. ": no source"
    end
    if src:byte(1) == 27 then
        return nil, name .. ": binary chunks are refused"
    end
    local chunk, err = loadstring(src, "@" .. name)
    if not chunk then
        return nil, err
    end
    jit.off(chunk, true)     -- the count hook does not fire in compiled traces
    sandbox.interruptible("@" .. name)
    local env = _M.new_env(opts.log)
    setfenv(chunk, env)
    local ok, p = guarded(limit, chunk)
    if not ok then
        return nil, p
    end
    if type(p) ~= "table" then
        return nil, name .. ": a policy must return a table, got " .. type(p)
    end
    local kind = rawget(p, "kind")
    if not _M.KINDS[kind] then
        return nil, name .. ": kind must be \"routing\", \"eviction\" or \"tenants\", got " .. what(kind)
    end
    if opts.kind and kind ~= opts.kind then
        return nil, format("%s: expected a %s policy, got %s", name, opts.kind, kind)
    end
    local ver = rawget(p, "version")
    if type(ver) ~= "string" and type(ver) ~= "number" then
        return nil, name .. ": version must be a string"
    end
    -- Snapshot: functions and a plain copy of the data (no metatables), so
    -- later changes to the policy's table do not change this version.
    local fns, data = {}, {}
    local key, val = next(p)
    while key ~= nil do
        if type(val) == "function" then
            fns[key] = val
        elseif type(key) == "string" then
            local c, bad = plain(val, nil, true)
            if bad then
                return nil, format("%s: %s holds %s (policy data must be plain)", name, key, bad)
            end
            data[key] = c
        end
        key, val = next(p, key)
    end
    local v = setmetatable({}, version_mt)
    fields_of[v] = {
        kind = kind, version = tostring(ver), name = name, serial = opts.serial or 0, limit = limit,
        fns = fns, data = data, source = src,
    }
    local function call(fname, ...)
        return v:call(fname, ...)
    end
    if fns.self_test then
        local ok2, res, why = call("self_test")
        if not ok2 then
            return nil, name .. ": self_test failed: " .. tostring(res)
        end
        if res == false then
            return nil, name .. ": self_test failed: " .. tostring(why or "returned false")
        end
    end
    local why = contracts[kind](setmetatable({}, { __index = function(_, k) return fns[k] or data[k] end }), call)
    if why then
        return nil, name .. ": contract: " .. why
    end
    return v
end


-- ---- the runtime ---------------------------------------------------------------------------

local function read_file(path)
    local f, err = io.open(path, "rb")
    if not f then
        return nil, err
    end
    local s = f:read("*a")
    f:close()
    return s
end


local now_ms = sandbox.now_ms
_M.now_ms = now_ms


local Runtime = {}
local runtime_mt = { __index = Runtime }
_M.Runtime_mt = runtime_mt


-- Runtime{ path | source, kind, interval_ms = 1000, limit, log, on_swap,
-- on_retire, name }: loads the file at once (raises when the first load
-- fails unless opts.lazy) and serves its current version.
--   log(line, level): level "warn" (a version rejected, on_retire failed)
--     or "notice" (a swap); a policy's print() passes no level.
--   on_swap(new, old): runs (guarded by pcall) after a swap; may return
--     nil, reason to veto the swap (e.g. tenants whose prompts did not
--     register), then the old version keeps serving.
--   on_retire(old): runs once a replaced version is no longer held.
function _M.Runtime(opts)
    if type(opts) ~= "table" then
        error("bad argument 'opts' to Runtime (expected a table)", 2)
    end
    if opts.kind and not _M.KINDS[opts.kind] then
        error("bad argument 'kind' to Runtime (expected routing, eviction or tenants, got "
            .. tostring(opts.kind) .. ")", 2)
    end
    if not opts.path and not opts.source then
        error("bad argument 'opts' to Runtime (needs path or source)", 2)
    end
    local rt = setmetatable({
        path = opts.path, source = opts.source, kind = opts.kind, name = opts.name or opts.path or "policy",
        interval_ms = opts.interval_ms or 1000, limit = opts.limit, load_ms = opts.load_ms,
        log = opts.log or function() end,
        on_swap = opts.on_swap, on_retire = opts.on_retire, clock = opts.clock or now_ms,
        reloads_ok = 0, reloads_rejected = 0, serial = 0, current = nil, last_error = nil,
        last_check = -math.huge, refs = setmetatable({}, { __mode = "k" }), retired = {},
        published = 0, seen = 0, history = {},
    }, runtime_mt)
    if not opts.lazy then
        local ok, err = rt:reload()
        if not ok then
            error("policy " .. rt.name .. " rejected: " .. tostring(err), 2)
        end
    end
    return rt
end


function Runtime:_reject(reason)
    self.reloads_rejected = self.reloads_rejected + 1
    self.last_error = reason
    self.log(format("policy %s rejected: %s (still serving %s)", self.name, reason,
        self.current and (self.current.version .. " #" .. self.current.serial) or "nothing"), "warn")
    return nil, reason
end


-- load_source(src) -> version or nil, reason: compiles, checks, swaps.
function Runtime:load_source(src)
    if self.current and src == self.current.source then
        self.src_seen = src
        return self.current     -- unchanged: nothing to do
    end
    self.src_seen = src
    local v, err = _M.compile(src, self.name, {
        kind = self.kind, limit = self.limit, serial = self.serial + 1, log = self.log, load_ms = self.load_ms,
    })
    if not v then
        return self:_reject(err)
    end
    local old = self.current
    if self.on_swap then
        local ok, res, why = pcall(self.on_swap, v, old)
        if not ok or res == nil then
            return self:_reject(self.name .. ": " .. tostring(ok and why or res))
        end
    end
    self.serial = self.serial + 1
    self.current = v
    self.reloads_ok = self.reloads_ok + 1
    self.last_error = nil
    self.history[#self.history + 1] = { serial = v.serial, version = v.version }
    self.log(format("policy %s: now serving %s #%d", self.name, v.version, v.serial), "notice")
    if old then
        self.retired[#self.retired + 1] = old
        self:_collect()
    end
    return v
end


-- reload() -> version or nil, reason: rereads the file (or opts.source).
function Runtime:reload()
    local src = self.source
    if self.path then
        local err
        src, err = read_file(self.path)
        if not src then
            return self:_reject(self.name .. ": cannot read: " .. tostring(err))
        end
    end
    self.last_check = self.clock()
    return self:load_source(src)
end


-- set_source(src): a runtime without a file gets new text (REPL, tests).
function Runtime:set_source(src)
    self.source = src
    return self:load_source(src)
end


-- maybe_reload() -> true when a new version was swapped in. Cheap: at most
-- every interval_ms, reads the file and compares it with what was seen.
function Runtime:maybe_reload()
    local t = self.clock()
    if t - self.last_check < self.interval_ms or not self.path then
        return false
    end
    self.last_check = t
    local src = read_file(self.path)
    if not src or src == self.src_seen then
        return false
    end
    local before = self.current
    local v = self:load_source(src)
    return v ~= nil and v ~= before
end


-- acquire() -> the current version, held until release(v): a request runs
-- on the version it started with.
function Runtime:acquire()
    local v = self.current
    if not v then
        error("policy " .. self.name .. " has no loaded version", 2)
    end
    self.refs[v] = (self.refs[v] or 0) + 1
    return v
end


function Runtime:release(v)
    local n = self.refs[v]
    if n then
        self.refs[v] = n > 1 and n - 1 or nil
    end
    self:_collect()
end


function Runtime:_collect()
    local keep = {}
    for _, old in ipairs(self.retired) do
        if self.refs[old] then
            keep[#keep + 1] = old
        elseif self.on_retire then
            local ok, err = pcall(self.on_retire, old)
            if not ok then
                self.log("policy " .. self.name .. ": on_retire failed: " .. tostring(err), "warn")
            end
        end
    end
    self.retired = keep
end


-- in_use(v) -> how many requests hold v.
function Runtime:in_use(v)
    return self.refs[v] or 0
end


function Runtime:counters()
    local v = self.current
    return {
        reloads_ok = self.reloads_ok, reloads_rejected = self.reloads_rejected,
        version = v and v.version, serial = v and v.serial or 0, last_error = self.last_error,
        retired_held = #self.retired,
    }
end


local apply = require "tinyloop.policy.apply"
_M.eviction_weights, _M.apply_eviction, _M.eviction_runtime = apply.eviction_weights, apply.apply_eviction,
    apply.eviction_runtime
_M.route = apply.route

-- route_fallbacks() -> how many routing choices fell back to least-loaded.
function _M.route_fallbacks()
    return apply.route_fallbacks
end


-- ---- publishing across nginx workers --------------------------------------------------------
--
-- dict is an ngx.shared.DICT (or anything with get/set/incr): the key
-- "<prefix>:<name>:n" counts published versions and "<prefix>:<name>:src"
-- holds the source. publish() after a successful reload in one worker;
-- every worker calls sync() at request boundaries (or from a timer).

function Runtime:_keys(prefix)
    local base = (prefix or "policy") .. ":" .. self.name
    return base .. ":n", base .. ":src"
end


-- publish(dict) -> the published number, or nil, reason when the current
-- source did not load here (nothing is published then).
function Runtime:publish(dict, prefix)
    local v = self.current
    if not v then
        return nil, "nothing loaded"
    end
    local kn, ks = self:_keys(prefix)
    dict:set(ks, v.source)
    local n = dict:incr(kn, 1, 0)
    self.published, self.seen = n, n
    return n
end


-- sync(dict) -> true when this worker swapped in a newer published version.
-- A version that fails to load here is rejected once (counted) and the
-- worker keeps its old one.
function Runtime:sync(dict, prefix)
    local kn, ks = self:_keys(prefix)
    local n = dict:get(kn)
    if not n or n == self.seen then
        return false
    end
    self.seen = n
    local src = dict:get(ks)
    if not src then
        return false
    end
    local before = self.current
    local v = self:load_source(src)
    return v ~= nil and v ~= before
end


return _M
