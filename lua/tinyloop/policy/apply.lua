-- Applying policies: eviction versions pushed into C as data (no callbacks),
-- routing over candidates. Re-exported by tinyloop.policy.
local contracts = require "tinyloop.policy.contracts"

local P = {}
local deep_copy, is_finite = contracts.deep_copy, contracts.is_finite


local WEIGHT_FIELDS = { recency = "last_access", hits = "hits", tokens = "n_tokens", depth = "start" }

-- eviction_weights(v) -> weights table for C: the policy's weights, or its
-- score(node) linearized (finite differences around a typical node) --
-- C applies a linear score; no callbacks into Lua.
function P.eviction_weights(v)
    local w = v:get("weights")
    if w then
        return { recency = w.recency or 0, hits = w.hits or 0, tokens = w.tokens or 0, depth = w.depth or 0 }
    end
    local base = deep_copy(contracts.SAMPLE_NODES[2])
    base.now = base.last_access
    local ok, s0 = v:call("score", deep_copy(base))
    if not ok or not is_finite(s0) then
        return nil, "score failed: " .. tostring(s0)
    end
    w = {}
    for k, field in pairs(WEIGHT_FIELDS) do
        local n = deep_copy(base)
        local d = math.max(1, math.abs(n[field]) * 0.01)
        n[field] = n[field] + d
        if field == "n_tokens" then
            n.tokens = n.n_tokens
        elseif field == "start" then
            n.depth = n.start
        elseif field == "last_access" then
            n.now = n.last_access
        end
        local ok2, s1 = v:call("score", n)
        if not ok2 or not is_finite(s1) then
            return nil, "score failed: " .. tostring(s1)
        end
        w[k] = (s1 - s0) / d
    end
    return w
end


-- spill_policy(v) -> { min_tokens, min_hits }: the version's spill table
-- (checked by its contract), missing fields as 0; a version without one
-- spills everything, so a reload that drops the table resets C.
function P.spill_policy(v)
    local sp = v:get("spill") or {}
    return { min_tokens = sp.min_tokens or 0, min_hits = sp.min_hits or 0 }
end


-- apply_eviction(model, v, pools) -> weights: pushes the eviction
-- version's weights and spill rule into C and its pool_policy into each
-- pool.
function P.apply_eviction(model, v, pools)
    local w, err = P.eviction_weights(v)
    if not w then
        return nil, err
    end
    model:set_evict_weights(w)
    model:set_spill_policy(P.spill_policy(v))
    local pp = v:get("pool_policy")
    if pp then
        for _, pool in pairs(pools or {}) do
            pool:set_policy(pp)
        end
    end
    return w
end


-- eviction_runtime(model, opts) -> a Runtime whose every swap pushes the
-- new version into model (and opts.pools); a version C refuses is rejected.
function P.eviction_runtime(model, opts)
    local o = {}
    for k, x in pairs(opts) do
        o[k] = x
    end
    o.kind = "eviction"
    o.on_swap = function(v)
        return P.apply_eviction(model, v, opts.pools)
    end
    return require("tinyloop.policy").Runtime(o)
end


local function common_prefix(a, b)
    local n = math.min(#a, #b)
    for i = 1, n do
        if a[i] ~= b[i] then
            return i - 1
        end
    end
    return n
end


-- route(v, request, candidates) -> candidate, index. Fills each
-- candidate's match (unless set) from c.shadow (a shadow Sim mirroring its
-- cache: longest cached match) and c.prefixes (registered token arrays
-- held), then asks the routing version. A failing or out-of-contract
-- choice falls back to the least loaded candidate (counted in
-- P.route_fallbacks).
P.route_fallbacks = 0
function P.route(v, req, cands)
    local toks = req.tokens or {}
    local views = {}
    for i, c in ipairs(cands) do
        local m = c.match
        if m == nil then
            m = 0
            if c.shadow then
                m = c.shadow:peek(toks, req.salt)
            end
            for _, p in ipairs(c.prefixes or {}) do
                local k = common_prefix(p, toks)
                if k == #p then
                    m = math.max(m, k)
                end
            end
        end
        views[i] = { id = c.id or i, load = c.load or 0, queued = c.queued or 0, capacity = c.capacity,
                     match = m }
    end
    local ok, got = v:call("choose", { tokens = toks, tenant = req.tenant, headers = deep_copy(req.headers) },
        views)
    if ok then
        for i, view in ipairs(views) do
            if rawequal(got, view) or got == i or got == view.id then
                return cands[i], i
            end
        end
    end
    P.route_fallbacks = P.route_fallbacks + 1
    local best, bi
    for i, view in ipairs(views) do
        if not best or view.load + view.queued < best.load + best.queued then
            best, bi = view, i
        end
    end
    return cands[bi], bi
end


return P
