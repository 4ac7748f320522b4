-- Tenants: a tenants policy (lua/policies/tenants.lua) applied to a model.
--
--   local Tenants = require "tinyloop.policy.tenants"
--   local mgr = Tenants.new(model, { path = "lua/policies/tenants.lua", log = print })
--   local out, info = mgr:generate({ api_key = "sk-acme", text = "Hello" }, { max_tokens = 16 })
--   -- info: tenant, tid, salt, policy (version), prefix ("name@version"),
--   --       prefix_tokens, cached (prompt tokens served from the cache), n_prompt
--   mgr:register("acme", "faq", "4", tokens)   -- named, versioned prefix
--
-- When a tenants version is swapped in, every prompt it lists is prefilled
-- and pinned first (a failure vetoes the swap: the old version keeps
-- serving); prompts the old version listed and the new one does not are
-- released once no request holds the old version. Prompts are keyed by
-- content, so an unchanged prompt is neither rebuilt nor released.
--   shared prompts   -> one shareable pool each, salt 0: cached once, used by all
--   tenant prompts   -> shared prefix + system prompt, in a pool with the
--                       tenant's salt and tenant id (its private namespace)
--   tenant prefixes  -> tenant prompt + prefix text, same namespace
-- Each tenant's kv_budget goes to tl_model_set_tenant_budget.
local tl = require "tinyloop"
local policy = require "tinyloop.policy"

local _M = {}
local M = {}
local mt = { __index = M }
_M.Manager_mt = mt

local format = string.format


-- salt_of(id) -> a stable salt in [1, 2^31 - 1] for a tenant id.
function _M.salt_of(id)
    local h = 2166136261
    for i = 1, #id do
        h = bit.tobit(bit.bxor(h, id:byte(i)) * 16777619)
    end
    return h % 2147483646 + 1
end


local function concat(a, b)
    local t = {}
    for i = 1, #a do
        t[i] = a[i]
    end
    for i = 1, #b do
        t[#a + i] = b[i]
    end
    return t
end


local function key_of(salt, tokens)
    return salt .. ":" .. table.concat(tokens, ",")
end


local function is_prefix(p, toks)
    if #p > #toks then
        return false
    end
    for i = 1, #p do
        if p[i] ~= toks[i] then
            return false
        end
    end
    return true
end


-- tokens_of(text | ids | { text | tokens }, first): text is tokenized
-- with BOS only when it starts the prompt.
function M:tokens_of(p, first)
    if type(p) == "string" then
        return self.model:tokenize(p, { add_special = first and true or false })
    end
    if type(p) == "table" and (p.text or p.tokens) then
        return self:tokens_of(p.text or p.tokens, first)
    end
    return p
end


-- tid(id) -> the integer tenant id used by C (stable per manager).
function M:tid(t)
    if t.tid then
        return t.tid
    end
    local id = t.id
    local n = self.tids[id]
    if not n then
        self.next_tid = self.next_tid + 1
        n = self.next_tid
        self.tids[id] = n
    end
    return n
end


function M.salt(_, t)
    if t.salt == false or t.salt == 0 then
        return 0
    end
    if type(t.salt) == "number" then
        return t.salt
    end
    return _M.salt_of(t.id)
end


-- Acquires (building when new) the pinned entry for tokens in a namespace.
-- Returns the entry or nil, reason.
function M:_ref(spec)
    local k = key_of(spec.salt, spec.tokens) .. (spec.shareable and ":s" or "")
    local e = self.entries[k]
    if not e then
        local pool = tl.PrefixPool(1)
        if spec.shareable then
            pool:set_shareable(true)
        end
        pool:set_salt(spec.salt)
        pool:set_tenant(spec.tid)
        local n, why = self.model:register_prefix(pool, spec.tokens)
        if n == 0 then
            pool:free()
            return nil, format("cannot prefill %s@%s: %s", spec.name, spec.version, tostring(why))
        end
        e = { key = k, pool = pool, tokens = spec.tokens, name = spec.name, version = spec.version,
              owner = spec.owner, salt = spec.salt, refs = 0 }
        self.entries[k] = e
        self.builds = self.builds + 1
    end
    e.refs = e.refs + 1
    return e
end


function M:_unref(e)
    e.refs = e.refs - 1
    if e.refs <= 0 and self.entries[e.key] == e then
        self.entries[e.key] = nil
        e.pool:free()
        self.releases = self.releases + 1
    end
end


-- The entries a tenants version lists: { spec, ... } and its tenants by id.
function M:_plan(v)
    local specs, shared = {}, {}
    for _, s in ipairs(v:get("shared") or {}) do
        local toks = self:tokens_of(s, true)
        shared[#shared + 1] = { name = s.name, version = tostring(s.version or "0"), tokens = toks }
        specs[#specs + 1] = { name = s.name, version = tostring(s.version or "0"), tokens = toks, salt = 0,
                              tid = 0, shareable = true, owner = "*" }
    end
    local tenants = {}
    for _, t in pairs(v:get("tenants") or {}) do
        tenants[t.id] = t
    end
    local default = v:get("default")
    if type(default) == "table" and default.id then
        tenants[default.id] = tenants[default.id] or default
    end
    for id, t in pairs(tenants) do
        local salt, tid = self:salt(t), self:tid(t)
        local base = shared[1] and shared[1].tokens or {}
        local sys = t.system
        if sys ~= nil and (type(sys) ~= "table" or type(sys[1]) == "number" or sys.text or sys.tokens) then
            sys = { sys }
        end
        for i, p in ipairs(sys or {}) do
            local toks = concat(base, self:tokens_of(p, #base == 0))
            specs[#specs + 1] = { name = id .. ".system" .. (i > 1 and i or ""), version = v.version,
                                  tokens = toks, salt = salt, tid = tid, owner = id }
            if i == 1 then
                base = toks
            end
        end
        for _, p in ipairs(t.prefixes or {}) do
            specs[#specs + 1] = { name = p.name, version = tostring(p.version or "0"), salt = salt, tid = tid,
                                  tokens = concat(base, self:tokens_of(p, #base == 0)), owner = id }
        end
        t.base = base
    end
    return specs, tenants
end


-- on_swap: prefill everything the new version lists before it serves.
function M:_swap(v)
    local ok, specs, tenants = pcall(self._plan, self, v)
    if not ok then
        return nil, "tenants: " .. tostring(specs)
    end
    local got = {}
    for _, spec in ipairs(specs) do
        local e, why = self:_ref(spec)
        if not e then
            for _, g in ipairs(got) do
                self:_unref(g)
            end
            return nil, why
        end
        got[#got + 1] = e
    end
    for _, t in pairs(tenants) do
        if t.kv_budget then
            self.model:set_tenant_budget(self:tid(t), t.kv_budget)
        end
    end
    self.held[v] = { entries = got, tenants = tenants }
    return true
end


function M:_retire(old)
    local h = self.held[old]
    self.held[old] = nil
    if h then
        for _, e in ipairs(h.entries) do
            self:_unref(e)
        end
    end
end


-- new(model, { path | source, log, interval_ms, limit }) -> manager.
function _M.new(model, opts)
    opts = opts or {}
    local self = setmetatable({
        model = model, entries = {}, held = {}, tids = {}, next_tid = 0, dynamic = {},
        builds = 0, releases = 0, observers = {}, log = opts.log or function() end,
    }, mt)
    self.runtime = policy.Runtime {
        path = opts.path, source = opts.source, kind = "tenants", log = self.log, name = opts.name,
        interval_ms = opts.interval_ms, limit = opts.limit, lazy = true,
        on_swap = function(v) return self:_swap(v) end,
        on_retire = function(old) self:_retire(old) end,
    }
    local ok, err = self.runtime:reload()
    if not ok then
        error("tenants policy rejected: " .. tostring(err), 2)
    end
    return self
end


-- resolve(request) -> tenant table (with tid, salt, base tokens) or nil,
-- reason, and the version resolved on (held: release with release(v)).
function M:resolve(req)
    local rt = self.runtime
    rt:maybe_reload()
    local v = rt:acquire()
    local ok, t = v:call("resolve", policy.deep_copy(req))
    if not ok or t == nil then
        rt:release(v)
        return nil, ok and "no tenant for this request" or ("tenants policy: " .. tostring(t))
    end
    if type(t) ~= "table" or (t.api_key ~= nil and t.api_key ~= req.api_key) then
        rt:release(v)     -- a tenant with a key is reached with that key only
        return nil, type(t) ~= "table" and "tenants policy: resolve returned " .. type(t)
            or "tenant " .. tostring(t.id) .. " needs its api_key"
    end
    local held = self.held[v]
    local full = held and held.tenants[t.id] or t
    return {
        id = t.id, tid = self:tid(t), salt = self:salt(t), priority = t.priority or 0,
        kv_budget = t.kv_budget, limits = t.limits or {}, base = full.base or {},
    }, nil, v
end


-- register(tenant_id, name, version, tokens) -> entry or nil, reason. The
-- new version is prefilled and pinned before the previous version of the
-- same name is released.
function M:register(tenant_id, name, version, tokens)
    local v = self.runtime.current
    local t = self.held[v] and self.held[v].tenants[tenant_id]
    local salt, tid = 0, 0
    if t then
        salt, tid = self:salt(t), self:tid(t)
    elseif tenant_id ~= "*" then
        return nil, "unknown tenant " .. tostring(tenant_id)
    end
    local e, why = self:_ref { name = name, version = tostring(version), tokens = self:tokens_of(tokens, true),
                               salt = salt, tid = tid, owner = tenant_id, shareable = tenant_id == "*" }
    if not e then
        return nil, why
    end
    local d = self.dynamic[tenant_id] or {}
    self.dynamic[tenant_id] = d
    local old = d[name]
    d[name] = e
    if old and old ~= e then
        self:_unref(old)
    end
    return e
end


-- prefixes(tenant_id) -> the entries visible to the tenant: shared ones
-- and its own, from the current version and register().
function M:visible(tenant_id)
    local list = {}
    for _, e in pairs(self.entries) do
        if e.owner == "*" or e.owner == tenant_id then
            list[#list + 1] = e
        end
    end
    return list
end


-- match(tenant_id, tokens) -> the longest visible registered prefix of
-- tokens: entry or nil.
function M:match(tenant_id, toks)
    local best
    for _, e in ipairs(self:visible(tenant_id)) do
        if (not best or #e.tokens > #best.tokens) and is_prefix(e.tokens, toks) then
            best = e
        end
    end
    return best
end


-- generate(request, opts) -> generated ids, info. request: api_key,
-- headers, and tokens (ids) or text; request.prefix names a tenant prefix
-- to put before it; request.raw = true sends tokens as they are (no
-- tenant prompt prepended). The tenant's limits apply.
function M:generate(req, opts)
    local t, why, v = self:resolve(req)
    if not t then
        return nil, why
    end
    local ok, out, info = pcall(self._generate, self, t, v, req, opts or {})
    self.runtime:release(v)
    if not ok then
        error(out, 2)
    end
    if not out then
        return nil, info
    end
    return out, info
end


function M:_generate(t, v, req, opts)
    local user = req.tokens or (req.text and self.model:tokenize(req.text, { add_special = false })) or {}
    local prompt = user
    if not req.raw then
        local base = t.base
        if req.prefix then
            local d = self.dynamic[t.id]
            local e = d and d[req.prefix]
            if not e then
                for _, x in ipairs(self:visible(t.id)) do
                    if x.name == req.prefix then
                        e = x
                    end
                end
            end
            if not e then
                return nil, "unknown prefix " .. tostring(req.prefix)
            end
            base = e.tokens
        end
        prompt = concat(base, user)
    end
    local lim = t.limits
    if lim.max_prompt and #prompt > lim.max_prompt then
        return nil, format("prompt of %d tokens exceeds tenant %s's max_prompt %d", #prompt, t.id, lim.max_prompt)
    end
    local o = {}
    for k, x in pairs(opts) do
        o[k] = x
    end
    o.max_tokens = math.min(o.max_tokens or 128, lim.max_tokens or math.huge, self.model.max_seq_len - #prompt)
    o.salt, o.tenant, o.priority = t.salt, t.tid, t.priority
    local m = self:match(t.id, prompt)
    local before = self.model:stats().prefill_tokens_saved
    local out = self.model:generate(prompt, o)
    local cached = self.model:stats().prefill_tokens_saved - before
    local info = {
        tenant = t.id, tid = t.tid, salt = t.salt, policy = v.version, n_prompt = #prompt, cached = cached,
        prefix = m and (m.name .. "@" .. m.version), prefix_tokens = m and #m.tokens or 0,
    }
    for _, f in ipairs(self.observers) do
        f(prompt, out, info)
    end
    return out, info
end


function M:counters()
    local c = self.runtime:counters()
    local n = 0
    for _ in pairs(self.entries) do
        n = n + 1
    end
    c.entries, c.builds, c.releases = n, self.builds, self.releases
    return c
end


function M:close()
    for _, e in pairs(self.entries) do
        e.pool:free()
    end
    self.entries = {}
end


return _M
