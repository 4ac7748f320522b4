-- Tenants on a live (synthetic) model: isolation with a shared operator
-- prompt, named versioned prefixes, reloads, per-tenant KV budgets.
local helpers = require "helpers"
local tl = require "tinyloop"
local Tenants = require "tinyloop.policy.tenants"

local model_path
local function synthetic()
    if not model_path then
        model_path = helpers.tmpdir() .. "/tenants.gguf"
        local out, ok = helpers.run("'" .. helpers.root .. "/bin/tl-gen-model' '" .. model_path
            .. "' --ctx 2048 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 320")
        assert(ok, out)
    end
    return model_path
end


local function ids(seed, n)
    local t = {}
    for i = 1, n do
        t[i] = (seed * 7919 + i * 31 + (i * i) % 17) % 300 + 5
    end
    return t
end


local function lua_list(t)
    return "{" .. table.concat(t, ",") .. "}"
end


local OP, SA, SB = ids(1, 96), ids(2, 40), ids(3, 40)

-- A tenants policy: operator prompt OP shared, tenants a and b with their
-- system prompts; salt (true = per tenant) as given.
local function tenants_src(o)
    o = o or {}
    return ([[
local P = { kind = "tenants", version = %q }
P.shared = { { name = "operator", version = "1", tokens = %s } }
P.tenants = {
    a = { id = "a", api_key = "ka", salt = %s, system = { tokens = %s }, kv_budget = %d,
          prefixes = { { name = "faq", version = "3", tokens = %s } } },
    b = { id = "b", api_key = "kb", salt = %s, system = { tokens = %s } },
}
function P.resolve(req)
    for _, t in pairs(P.tenants) do
        if t.api_key == req.api_key then return t end
    end
end
return P
]]):format(o.version or "1", lua_list(OP), tostring(o.salt ~= false), lua_list(o.sa or SA), o.budget or 0,
        lua_list(ids(4, 20)), tostring(o.salt ~= false), lua_list(SB))
end


describe("Tenants", function()
    local model, mgr

    local function open(o, mopts)
        model = tl.Model(synthetic(), mopts or { max_seq_len = 2048 })
        mgr = Tenants.new(model, { source = tenants_src(o) })
    end

    after_each(function()
        if mgr then
            mgr:close()
        end
        if model then
            model:close()
        end
        mgr, model = nil, nil
    end)

    -- the same text sent by both tenants: the operator prompt, then private text
    local PRIV = helpers.concat(OP, ids(9, 80))

    it("isolates tenants with salts while both hit the shared operator prompt", function()
        open()
        local _, a1 = mgr:generate({ api_key = "ka", tokens = PRIV, raw = true }, { max_tokens = 2 })
        assert.equal(#OP, a1.cached)                 -- the operator prompt, shared
        assert.equal("operator@1", a1.prefix)
        local _, a2 = mgr:generate({ api_key = "ka", tokens = PRIV, raw = true }, { max_tokens = 2 })
        assert.is_true(a2.cached > #OP)               -- a's own continuation, cached
        local s0 = model:stats()
        local _, b1 = mgr:generate({ api_key = "kb", tokens = PRIV, raw = true }, { max_tokens = 2 })
        local s1 = model:stats()
        -- b never matches a's private blocks: only the shared prompt
        assert.equal(#OP, b1.cached)
        assert.equal(#OP, s1.prefill_tokens_saved - s0.prefill_tokens_saved)
        assert.equal(#PRIV - #OP, s1.prefill_tokens - s0.prefill_tokens)
        assert.not_equal(a1.salt, b1.salt)
        -- the operator prompt is one shareable node, held once
        local shared = 0
        for _, n in ipairs(model:cache_nodes()) do
            if n.shareable and n.pinned then
                shared = shared + 1
            end
        end
        assert.equal(1, shared)
    end)

    it("shares everything without salts (the control for the isolation test)", function()
        open { salt = false }
        mgr:generate({ api_key = "ka", tokens = PRIV, raw = true }, { max_tokens = 2 })
        local _, b1 = mgr:generate({ api_key = "kb", tokens = PRIV, raw = true }, { max_tokens = 2 })
        assert.is_true(b1.cached > #OP)
    end)

    it("prepends the tenant's prompts and reports the matched prefix as name@version", function()
        open()
        local _, info = mgr:generate({ api_key = "ka", tokens = { 7, 8, 9 } }, { max_tokens = 2 })
        assert.equal("a.system@1", info.prefix)
        assert.equal(#OP + #SA, info.prefix_tokens)
        assert.equal(#OP + #SA, info.cached)
        assert.equal(#OP + #SA + 3, info.n_prompt)
        local _, f = mgr:generate({ api_key = "ka", tokens = { 7, 8, 9 }, prefix = "faq" }, { max_tokens = 2 })
        assert.equal("faq@3", f.prefix)
        assert.equal(#OP + #SA + 20, f.cached)
    end)

    it("prefills a new prefix version before releasing the old one", function()
        open()
        local base = helpers.concat(OP, SA)
        local v1 = assert(mgr:register("a", "docs", "1", helpers.concat(base, ids(5, 30))))
        local v2 = assert(mgr:register("a", "docs", "2", helpers.concat(base, ids(6, 30))))
        assert.is_true(v1.pool:is_freed())
        assert.is_false(v2.pool:is_freed())
        local _, info = mgr:generate({ api_key = "ka", tokens = { 11, 12 }, prefix = "docs" }, { max_tokens = 2 })
        assert.equal("docs@2", info.prefix)
        assert.equal(#base + 30, info.cached)
        assert.is_nil(mgr:register("zz", "docs", "1", { 1, 2 }))
    end)

    it("registers a reloaded version's prompts and releases the ones it dropped", function()
        open()
        local c0 = mgr:counters()
        local held = mgr.runtime:acquire()          -- a request in flight on version 1
        local SA2 = ids(7, 40)
        assert.is_truthy(mgr.runtime:set_source(tenants_src { version = "2", sa = SA2 }))
        local c1 = mgr:counters()
        assert.equal("2", c1.version)
        assert.equal(c0.builds + 2, c1.builds)      -- a.system and faq rebuilt on the new system prompt
        assert.equal(c0.releases, c1.releases)      -- the old ones stay while version 1 is held
        mgr.runtime:release(held)
        local c2 = mgr:counters()
        assert.equal(c0.releases + 2, c2.releases)
        assert.equal(c0.entries, c2.entries)
        local _, info = mgr:generate({ api_key = "ka", tokens = { 7 } }, { max_tokens = 2 })
        assert.equal("a.system@2", info.prefix)
        assert.equal(#OP + #SA2, info.cached)
    end)

    it("keeps serving the old version when a reload's prompt cannot be prefilled", function()
        open()
        local bad = tenants_src { version = "3", sa = ids(8, 3000) }
        assert.is_nil(mgr.runtime:set_source(bad))
        assert.equal("1", mgr:counters().version)
        local _, info = mgr:generate({ api_key = "ka", tokens = { 7 } }, { max_tokens = 2 })
        assert.equal("a.system@1", info.prefix)
    end)

    -- b sends 60 tokens after its prompts; a bursts 12 distinct 120-token
    -- requests into 128 blocks of 16 tokens. Returns b's cached tokens on its
    -- repeat and the blocks a holds.
    local function burst(budget)
        open({ budget = budget }, { max_seq_len = 2048, kv_mem = 128 * 2048 })
        local mine = ids(20, 60)
        mgr:generate({ api_key = "kb", tokens = mine }, { max_tokens = 2 })
        for i = 1, 12 do
            mgr:generate({ api_key = "ka", tokens = ids(100 + i, 120) }, { max_tokens = 2 })
        end
        local a_blocks = model:tenant_blocks(mgr:tid { id = "a" })
        local _, info = mgr:generate({ api_key = "kb", tokens = mine }, { max_tokens = 2 })
        return info.cached, a_blocks, info.n_prompt
    end

    it("keeps a tenant's burst from flushing another tenant's cache (KV budget)", function()
        local cached, a_blocks, n = burst(24)
        assert.equal(n - 1, cached)              -- all of b's prompt but the last token
        assert.is_true(a_blocks <= 24 + 40, "tenant a holds " .. a_blocks .. " blocks")
    end)

    it("lets a burst flush another tenant's unpinned cache without a budget (the control)", function()
        local cached = burst(0)
        assert.equal(#OP + #SB, cached)          -- only b's pinned prompt survived
    end)
end)
