-- PrefixPool match scope and hit attribution (issue 16): by default a call
-- through a pool reuses anything cached and the hit is counted by the pool
-- whose entry owns the reused blocks; set_scope("pool") limits a pool to its
-- own entries.
local helpers = require "helpers"

local range, concat = helpers.range, helpers.concat

describe("tinyloop.PrefixPool", function()
    local tl = require "tinyloop"

    describe(":set_scope()", function()
        it("rejects a scope other than \"shared\" or \"pool\"", function()
            local pool = tl.PrefixPool(2)
            assert.has_error(function() pool:set_scope("global") end,
                "bad argument 'scope' to set_scope (expected \"shared\" or \"pool\", got \"global\")")
            assert.has_error(function() pool:set_scope() end,
                "bad argument 'scope' to set_scope (expected \"shared\" or \"pool\", got nil)")
        end)
    end)

    if helpers.skip_without_model() then
        return
    end

    local model
    local greedy = { max_tokens = 4, temperature = 0 }
    local A = range(100, 119)                -- 20 tokens
    local prompt = concat(A, range(200, 207)) -- A + 8 tokens

    -- Prompt tokens served from the cache by one call.
    local function saved_by(fn)
        local s0 = model:stats()
        fn()
        return model:stats().prefill_tokens_saved - s0.prefill_tokens_saved
    end

    before_each(function()
        model = tl.Model(helpers.model_path)
    end)

    after_each(function()
        model:close()
    end)

    it("shares the whole cache by default and counts the hit in the owning pool", function()
        local a, b = tl.PrefixPool(4), tl.PrefixPool(4)
        model:register_prefix(a, A)
        local saved = saved_by(function() model:generate_with_pool(b, prompt, greedy) end)
        assert.are.equal(20, saved)
        local sa, sb = a:stats(), b:stats()
        assert.are.same({ 1, 0, 0 }, { sb.lookups, sb.hits, sb.hit_tokens })
        assert.are.same({ 0, 1, 20 }, { sa.lookups, sa.hits, sa.hit_tokens })
    end)

    it("with scope \"pool\" an empty pool reuses nothing the cache holds", function()
        local pool = tl.PrefixPool(4)
        pool:set_scope("pool")
        model:generate(prompt, greedy) -- the prompt is now cached
        local saved = saved_by(function() model:generate_with_pool(pool, prompt, greedy) end)
        assert.are.equal(0, saved)
    end)

    it("with scope \"pool\" reuses exactly its own longest entry and equals plain generation", function()
        local pool = tl.PrefixPool(4)
        pool:set_scope("pool")
        model:register_prefix(pool, A)
        model:generate(prompt, greedy) -- a longer cached run the pool must not use (it reused A: A's hit)
        local s0 = pool:stats()
        local out
        local saved = saved_by(function() out = model:generate_with_pool(pool, prompt, greedy) end)
        assert.are.equal(20, saved)
        assert.are.same(concat(prompt, model:generate(prompt, { max_tokens = 4, temperature = 0, no_cache = true })),
            out)
        local s1 = pool:stats()
        assert.are.same({ 1, 1, 20 }, { s1.lookups - s0.lookups, s1.hits - s0.hits, s1.hit_tokens - s0.hit_tokens })
    end)
end)
