-- Policy contracts: what each kind must define, checked on sample inputs
-- (see tinyloop.policy).
local _M = {}

local type, pairs, ipairs, tostring, rawequal = type, pairs, ipairs, tostring, rawequal
local format = string.format


local function is_finite(x)
    return type(x) == "number" and x == x and x ~= math.huge and x ~= -math.huge
end
_M.is_finite = is_finite


local WEIGHT_KEYS = { recency = true, hits = true, tokens = true, depth = true }
local POOL_POLICIES = { shortest = true, lru = true, cost = true }

_M.SAMPLE_NODES = {
    { id = 1, parent = 0, start = 0, n_tokens = 300, tokens = 300, n_blocks = 19, hits = 12, last_access = 90,
      depth = 0, tenant = 1, pinned = false, locked = false, leaf = false, shareable = true, cost = 300 },
    { id = 2, parent = 1, start = 300, n_tokens = 40, tokens = 40, n_blocks = 3, hits = 1, last_access = 95,
      depth = 300, tenant = 1, pinned = false, locked = false, leaf = true, shareable = false, cost = 340 },
    { id = 3, parent = 0, start = 0, n_tokens = 1, tokens = 1, n_blocks = 1, hits = 0, last_access = 0,
      depth = 0, tenant = 0, pinned = false, locked = false, leaf = true, shareable = false, cost = 1 },
    { id = 4, parent = 1, start = 300, n_tokens = 1500, tokens = 1500, n_blocks = 94, hits = 1000000,
      last_access = 1e9, depth = 300, tenant = 7, pinned = true, locked = false, leaf = true, shareable = false,
      cost = 1800 },
}

_M.SAMPLE_REQUESTS = {
    { api_key = "sk-unknown", headers = { ["x-tenant"] = "nobody" }, tokens = { 1, 2, 3 }, text = "hi" },
    { api_key = "", headers = {}, tokens = {}, text = "" },
    { headers = {} },
}

_M.SAMPLE_CANDIDATES = {
    { { id = "a", load = 0, queued = 0, match = 0, capacity = 8 } },
    { { id = "a", load = 3, queued = 1, match = 120, capacity = 8 },
      { id = "b", load = 0, queued = 0, match = 0, capacity = 8 } },
    { { id = "a", load = 100, queued = 50, match = 0, capacity = 8 },
      { id = "b", load = 1, queued = 0, match = 2, capacity = 8 },
      { id = "c", load = 1, queued = 0, match = 900, capacity = 8 } },
}


local function deep_copy(x)
    if type(x) ~= "table" then
        return x
    end
    local c = {}
    for k, v in pairs(x) do
        c[k] = deep_copy(v)
    end
    return c
end
_M.deep_copy = deep_copy


-- impersonation_probes(tenants) -> requests that name each listed tenant
-- (by its key in the table and its id) in the usual tenant headers,
-- without an API key and with a wrong one; req.what describes each.
local TENANT_HEADERS = { "x-tenant", "x-tenant-id", "tenant" }
function _M.impersonation_probes(tenants)
    local names, probes = {}, {}
    for k, t in pairs(type(tenants) == "table" and tenants or {}) do
        names[#names + 1] = k
        if type(t) == "table" and t.id ~= nil then
            names[#names + 1] = t.id
        end
    end
    for _, name in ipairs(names) do
        if type(name) == "string" then
            for _, h in ipairs(TENANT_HEADERS) do
                probes[#probes + 1] = { headers = { [h] = name }, tokens = {}, text = "",
                    what = format("without an API key and with %s: %s", h, name) }
                probes[#probes + 1] = { api_key = "sk-tinyloop-contract-probe", headers = { [h] = name },
                    tokens = {}, text = "", what = format("with a wrong API key and %s: %s", h, name) }
            end
        end
    end
    return probes
end


local function check_weights(w)
    if type(w) ~= "table" then
        return "weights must be a table"
    end
    for k, v in pairs(w) do
        if not WEIGHT_KEYS[k] then
            return format("weights.%s is not one of recency, hits, tokens, depth", tostring(k))
        end
        if not is_finite(v) then
            return format("weights.%s must be a finite number, got %s", k, tostring(v))
        end
    end
end


-- An eviction policy's spill = { min_tokens = N, min_hits = M }: what an
-- evicted node needs to go down a KV tier rather than be dropped (pushed
-- into C with set_spill_policy; both optional, 0 = no minimum).
local SPILL_KEYS = { min_tokens = true, min_hits = true }
local INT_MAX = 2147483647

local function check_spill(sp)
    if type(sp) ~= "table" then
        return "spill must be a table { min_tokens = N, min_hits = M }, got " .. type(sp)
    end
    for k, v in pairs(sp) do
        if not SPILL_KEYS[k] then
            return format("spill.%s is not one of min_tokens, min_hits", tostring(k))
        end
        if not is_finite(v) or v % 1 ~= 0 or v < 0 or v > INT_MAX then
            return format("spill.%s must be a non-negative integer, got %s", k, tostring(v))
        end
    end
end
_M.check_spill = check_spill


-- check_tenant(t) -> nil or a reason: the shape resolve() must return.
function _M.check_tenant(t)
    if type(t) ~= "table" then
        return "a tenant must be a table, got " .. type(t)
    end
    if type(t.id) ~= "string" or t.id == "" then
        return "tenant.id must be a non-empty string"
    end
    local where = "tenant " .. t.id .. ": "
    if t.api_key ~= nil and (type(t.api_key) ~= "string" or t.api_key == "") then
        return where .. "api_key must be a non-empty string"
    end
    local function prompt_ok(p)
        if type(p) == "string" then
            return true
        end
        if type(p) ~= "table" then
            return false
        end
        if p.text ~= nil or p.tokens ~= nil then
            return prompt_ok(p.text or p.tokens)
        end
        for i = 1, #p do
            if type(p[i]) ~= "number" or p[i] % 1 ~= 0 or p[i] < 0 then
                return false
            end
        end
        return true
    end
    local sys = t.system
    if sys ~= nil then
        local list = (type(sys) == "table" and type(sys[1]) ~= "number") and sys or { sys }
        for i = 1, #list do
            if not prompt_ok(list[i]) then
                return where .. "system prompts must be text, token ids or { text | tokens }"
            end
        end
    end
    for _, k in ipairs { "priority", "kv_budget", "tid" } do
        if t[k] ~= nil and (not is_finite(t[k]) or t[k] % 1 ~= 0 or t[k] < 0) then
            return where .. k .. " must be a non-negative integer"
        end
    end
    if t.salt ~= nil and t.salt ~= false and t.salt ~= true and not (is_finite(t.salt) and t.salt >= 0) then
        return where .. "salt must be a non-negative number, true (derived from the id) or false"
    end
    if t.pool ~= nil and type(t.pool) ~= "string" then
        return where .. "pool must be a string"
    end
    if t.allow_system ~= nil and type(t.allow_system) ~= "boolean" then
        return where .. "allow_system must be a boolean"
    end
    if t.limits ~= nil then
        if type(t.limits) ~= "table" then
            return where .. "limits must be a table"
        end
        for k, v in pairs(t.limits) do
            if not (is_finite(v) and v >= 0) then
                return where .. "limits." .. tostring(k) .. " must be a non-negative number"
            end
        end
    end
    if t.prefixes ~= nil then
        if type(t.prefixes) ~= "table" then
            return where .. "prefixes must be an array"
        end
        for i, p in ipairs(t.prefixes) do
            if type(p) ~= "table" or type(p.name) ~= "string" or (p.text == nil and p.tokens == nil) then
                return where .. "prefixes[" .. i .. "] must be { name, version, text | tokens }"
            end
        end
    end
end


-- The contract of each kind: fields, then a run on sample inputs. Each
-- returns nil or a reason. `call` runs a policy function guarded.
local contracts = {}

function contracts.routing(p, call)
    if type(p.choose) ~= "function" then
        return "a routing policy must define choose(request, candidates)"
    end
    for _, cands in ipairs(_M.SAMPLE_CANDIDATES) do
        for _, req in ipairs(_M.SAMPLE_REQUESTS) do
            local cs = deep_copy(cands)
            local ok, got = call("choose", deep_copy(req), cs)
            if not ok then
                return "choose failed on a sample: " .. tostring(got)
            end
            local found = false
            for i, c in ipairs(cs) do
                if rawequal(got, c) or got == i or got == c.id then
                    found = true
                end
            end
            if not found then
                return "choose must return one of the candidates (or its index or id), got " .. tostring(got)
            end
        end
    end
end


function contracts.eviction(p, call)
    if p.score == nil and p.weights == nil then
        return "an eviction policy must define score(node) or weights"
    end
    if p.score ~= nil and type(p.score) ~= "function" then
        return "score must be a function"
    end
    if p.weights ~= nil then
        local why = check_weights(p.weights)
        if why then
            return why
        end
    end
    if p.spill ~= nil then
        local why = check_spill(p.spill)
        if why then
            return why
        end
    end
    if p.pool_policy ~= nil and not POOL_POLICIES[p.pool_policy] then
        return "pool_policy must be \"shortest\", \"lru\" or \"cost\", got " .. tostring(p.pool_policy)
    end
    if p.score then
        for _, n in ipairs(_M.SAMPLE_NODES) do
            local ok, s = call("score", deep_copy(n))
            if not ok then
                return "score failed on a sample node: " .. tostring(s)
            end
            if not is_finite(s) then
                return "score must return a finite number, got " .. tostring(s)
            end
        end
    end
end


function contracts.tenants(p, call)
    if type(p.resolve) ~= "function" then
        return "a tenants policy must define resolve(request)"
    end
    if p.tenants ~= nil and type(p.tenants) ~= "table" then
        return "tenants must be a table of tenant definitions"
    end
    local n = 0
    for _, t in pairs(p.tenants or {}) do
        local why = _M.check_tenant(t)
        if why then
            return why
        end
        n = n + 1
    end
    if p.shared ~= nil then
        if type(p.shared) ~= "table" then
            return "shared must be an array of operator prompts"
        end
        for i, s in ipairs(p.shared) do
            if type(s) ~= "table" or type(s.name) ~= "string" or (s.text == nil and s.tokens == nil) then
                return "shared[" .. i .. "] must be { name, version, text | tokens }"
            end
        end
    end
    for _, req in ipairs(_M.SAMPLE_REQUESTS) do
        local ok, t = call("resolve", deep_copy(req))
        if not ok then
            return "resolve failed on a sample request: " .. tostring(t)
        end
        if t ~= nil then
            local why = _M.check_tenant(t)
            if why then
                return "resolve returned a bad tenant: " .. why
            end
        end
    end
    -- A tenant with an api_key is reached with that key only: a request
    -- without a key (or with another key) that names a keyed tenant in a
    -- header must resolve to nil or to a tenant without a key ("public").
    for _, req in ipairs(_M.impersonation_probes(p.tenants)) do
        local ok, got = call("resolve", req)
        if not ok then
            return "resolve failed on a request " .. req.what .. ": " .. tostring(got)
        end
        if type(got) == "table" and got.api_key ~= nil and got.api_key ~= req.api_key then
            return format("resolve maps a request %s to tenant %s, which has an api_key; a tenant "
                .. "with a key may only be reached with that key (map such requests to a tenant "
                .. "without api_key, or return nil)", req.what, tostring(got.id))
        end
    end
    -- every listed tenant's own api key must resolve to it
    for _, t in pairs(p.tenants or {}) do
        if t.api_key then
            local ok, got = call("resolve", { api_key = t.api_key, headers = {}, tokens = {}, text = "" })
            if not ok then
                return "resolve failed for tenant " .. t.id .. ": " .. tostring(got)
            end
            if type(got) ~= "table" or got.id ~= t.id then
                return "resolve does not map tenant " .. t.id .. "'s api_key to it"
            end
        end
    end
end
_M.contracts = contracts



return _M
