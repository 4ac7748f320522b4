-- Every statement of the PrefixPool contract (docs/prefix-pool.md), through the Lua API,
-- on stories260K (and a synthetic looped model for the loops key).
local helpers = require "helpers"

local range, concat, slice = helpers.range, helpers.concat, helpers.slice

describe("tinyloop.PrefixPool", function()
    local tl = require "tinyloop"

    describe("construction", function()
        it("holds 16 entries by default and starts empty", function()
            local pool = tl.PrefixPool()
            assert.are.equal(16, pool:capacity())
            assert.are.equal(0, pool:size())
            assert.are.equal(0, pool:total_cached_tokens())
        end)

        it("coerces capacity 0 to 1", function()
            assert.are.equal(1, tl.PrefixPool(0):capacity())
        end)

        it("rejects a negative or non-integer capacity", function()
            assert.has_error(function() tl.PrefixPool(-1) end,
                "bad argument 'capacity' to PrefixPool (expected an integer >= 0, got -1)")
            assert.has_error(function() tl.PrefixPool(2.5) end,
                "bad argument 'capacity' to PrefixPool (expected an integer >= 0, got 2.5)")
            assert.has_error(function() tl.PrefixPool("8") end,
                "bad argument 'capacity' to PrefixPool (expected an integer >= 0, got \"8\")")
        end)

        it("can be freed explicitly, after which its methods raise", function()
            local pool = tl.PrefixPool(2)
            pool:free()
            pool:free()
            assert.is_true(pool:is_freed())
            assert.has_error(function() pool:size() end, "tinyloop.PrefixPool is freed; cannot call size")
        end)
    end)

    if helpers.skip_without_model() then
        return
    end

    local model, base
    local greedy = { max_tokens = 8, temperature = 0 }
    -- Distinct token runs (ids 3..511 are ordinary pieces in stories260K).
    local A = range(100, 109)             -- 10 tokens
    local B = range(100, 105)             -- 6 tokens, a prefix of A
    local X = range(300, 303)             -- 4 tokens, unrelated

    -- The prompt tokens computed and served from cache by one call.
    local function prefill_of(fn)
        local s0 = model:stats()
        local r = fn()
        local s1 = model:stats()
        return s1.prefill_tokens - s0.prefill_tokens, s1.prefill_tokens_saved - s0.prefill_tokens_saved, r
    end

    -- Plain generation that neither uses nor fills the cache: the reference.
    local function plain(prompt, opts)
        local o = { no_cache = true }
        for k, v in pairs(opts or greedy) do
            o[k] = v
        end
        return concat(prompt, model:generate(prompt, o))
    end

    before_each(function()
        model = tl.Model(helpers.model_path)
        base = model:stats()
    end)

    after_each(function()
        model:close()
    end)

    describe("construction", function()
        it("allocates no KV memory", function()
            local pool = tl.PrefixPool(16)
            assert.are.equal(base.blocks_used, model:stats().blocks_used)
            pool:free()
        end)
    end)

    describe(":register_prefix()", function()
        it("returns the matchable length and grows size and total_cached_tokens", function()
            local pool = tl.PrefixPool(4)
            assert.are.equal(10, model:register_prefix(pool, A))
            assert.are.equal(4, model:register_prefix(pool, X))
            assert.are.equal(2, pool:size())
            assert.are.equal(14, pool:total_cached_tokens())
            assert.is_true(model:stats().blocks_used > base.blocks_used)
        end)

        it("is a no-op for a key already present", function()
            local pool = tl.PrefixPool(4)
            model:register_prefix(pool, A)
            local s = pool:stats()
            assert.are.equal(10, model:register_prefix(pool, A))
            assert.are.equal(1, pool:size())
            assert.are.equal(10, pool:total_cached_tokens())
            assert.are.equal(s.registrations, pool:stats().registrations)
        end)

        it("keys on cache_window too: the same tokens at another window are a new entry", function()
            local pool = tl.PrefixPool(4)
            model:register_prefix(pool, A)
            model:register_prefix(pool, A, { cache_window = 8 })
            assert.are.equal(2, pool:size())
        end)

        it("copies the tokens: the caller may mutate its table afterwards", function()
            local pool = tl.PrefixPool(4)
            local t = range(100, 109)
            model:register_prefix(pool, t)
            t[3] = 400
            assert.are.equal(10, model:register_prefix(pool, A))
            assert.are.equal(1, pool:size())
        end)

        it("evicts the shortest entry when an insert would exceed capacity", function()
            local pool = tl.PrefixPool(2)
            model:register_prefix(pool, A)     -- 10
            model:register_prefix(pool, X)     -- 4
            model:register_prefix(pool, B)     -- 6: X goes
            assert.are.equal(2, pool:size())
            assert.are.equal(16, pool:total_cached_tokens())
            assert.are.equal(1, pool:stats().evictions)
            -- X is gone: registering it again is not a no-op, and B (shortest now) goes.
            model:register_prefix(pool, X)
            assert.are.equal(14, pool:total_cached_tokens())
        end)

        it("keeps one entry in a pool of capacity 0", function()
            local pool = tl.PrefixPool(0)
            model:register_prefix(pool, A)
            model:register_prefix(pool, X)
            assert.are.equal(1, pool:size())
            assert.are.equal(4, pool:total_cached_tokens())
        end)

        it("uses the model's default loop depth (0 = default, not docs/prefix-pool.md's 8)", function()
            local pool = tl.PrefixPool(4)
            model:register_prefix(pool, A)
            -- stories260K has no loop block: any loops value means 1, the same key.
            assert.are.equal(10, model:register_prefix(pool, A, { loops = 8 }))
            assert.are.equal(1, pool:size())
        end)
    end)

    describe(":generate_with_pool()", function()
        it("returns the prompt followed by the generated tokens", function()
            local pool = tl.PrefixPool(4)
            local out = model:generate_with_pool(pool, A, greedy)
            assert.are.equal(10 + 8, #out)
            assert.are.same(A, slice(out, 1, 10))
        end)

        it("uses docs/prefix-pool.md's defaults: max_tokens 128, temperature 1.0, top_k 50", function()
            local pool = tl.PrefixPool(4)
            -- stories260K's own context is 128: the default max_tokens does not fit.
            assert.has_error(function() model:generate_with_pool(pool, { 1, 403 }) end,
                "bad argument 'max_tokens' to generate_with_pool (prompt length 2 + max_tokens 128 exceeds max_seq_len 128)")
            local m = tl.Model(helpers.model_path, { max_seq_len = 256 })
            local p2 = tl.PrefixPool(4)
            local a = m:generate_with_pool(p2, { 1, 403 }, { seed = 3, ignore_eos = true })
            assert.are.equal(2 + 128, #a)
            assert.are.same(a, m:generate_with_pool(p2, { 1, 403 }, { seed = 3, ignore_eos = true,
                max_tokens = 128, temperature = 1.0, top_k = 50 }))
            assert.are_not.same(a, m:generate_with_pool(p2, { 1, 403 }, { seed = 3, ignore_eos = true,
                temperature = 0 }))
            m:close()
        end)

        describe("execution flow", function()
            it("1. looks up the longest registered entry the prompt starts with", function()
                local pool = tl.PrefixPool(4)
                model:register_prefix(pool, B)
                model:register_prefix(pool, A)
                model:generate_with_pool(pool, concat(A, { 200, 201 }), greedy)
                local s = pool:stats()
                assert.are.same({ 1, 1, 10 }, { s.lookups, s.hits, s.hit_tokens })
            end)

            it("2. with no match, behaves like generate", function()
                local pool = tl.PrefixPool(4)
                model:register_prefix(pool, X)
                local prompt = concat(A, { 200 })
                local computed, saved, out = prefill_of(function()
                    return model:generate_with_pool(pool, prompt, greedy)
                end)
                assert.are.same(plain(prompt), out)
                assert.are.same({ 11, 0 }, { computed, saved })
                assert.are.equal(0, pool:stats().hits)
            end)

            it("2b. with an empty pool, behaves like generate", function()
                local pool = tl.PrefixPool(4)
                assert.are.same(plain(A), model:generate_with_pool(pool, A, greedy))
            end)

            it("3. with the whole prompt cached, computes nothing", function()
                local pool = tl.PrefixPool(4)
                model:register_prefix(pool, A)
                local computed, saved, out = prefill_of(function()
                    return model:generate_with_pool(pool, A, greedy)
                end)
                assert.are.same(plain(A), out)
                -- The entry keeps its last position's logits (issue 16).
                assert.are.same({ 0, 10 }, { computed, saved })
            end)

            it("4. with a strict prefix cached, prefills only the suffix", function()
                local pool = tl.PrefixPool(4)
                model:register_prefix(pool, B)
                local prompt = concat(B, { 250, 251, 252 })
                local computed, saved, out = prefill_of(function()
                    return model:generate_with_pool(pool, prompt, greedy)
                end)
                assert.are.same(plain(prompt), out)
                assert.are.same({ 3, 6 }, { computed, saved })
            end)

            it("5. falls through to plain generation on an internal failure", function()
                pending("no public way to inject a failure into the cached path; covered by C tests")
            end)
        end)

        describe("matching", function()
            it("misses on a cache_window mismatch and hits when it matches", function()
                local pool = tl.PrefixPool(4)
                model:register_prefix(pool, A, { cache_window = 0 })
                local prompt = concat(A, { 200 })
                local _, saved = prefill_of(function()
                    return model:generate_with_pool(pool, prompt, { max_tokens = 4, temperature = 0,
                        cache_window = 8 })
                end)
                assert.are.equal(0, saved)
                _, saved = prefill_of(function()
                    return model:generate_with_pool(pool, concat(A, { 201 }), { max_tokens = 4, temperature = 0 })
                end)
                assert.are.equal(10, saved)
            end)

            it("compares raw token ids: a prompt differing at id k reuses at most k tokens", function()
                local pool = tl.PrefixPool(4)
                model:register_prefix(pool, A)
                local prompt = slice(A, 1, 10)
                prompt[4] = 400
                local _, saved, out = prefill_of(function()
                    return model:generate_with_pool(pool, prompt, greedy)
                end)
                assert.are.equal(3, saved)
                assert.are.same(plain(prompt), out)
            end)

            it("does not normalise text: other ids for the same text miss after the difference", function()
                local pool = tl.PrefixPool(4)
                local ids = model:tokenize("Once upon a time")      -- BOS Once " upon" " a" " time"
                model:register_prefix(pool, ids)
                local spelled = { 1, 403, 350, 289, 261, 378 }          -- BOS Once " up" "on" " a" " time"
                assert.are.equal(model:detokenize(ids), model:detokenize(spelled))
                local _, saved, out = prefill_of(function()
                    return model:generate_with_pool(pool, spelled, greedy)
                end)
                assert.are.equal(2, saved)
                assert.are.same(plain(spelled), out)
            end)

            it("prefers the longest matching entry", function()
                local pool = tl.PrefixPool(4)
                model:register_prefix(pool, slice(A, 1, 3))
                model:register_prefix(pool, A)
                model:register_prefix(pool, B)
                local _, saved = prefill_of(function()
                    return model:generate_with_pool(pool, concat(A, { 200 }), greedy)
                end)
                assert.are.equal(10, saved)
            end)
        end)

        it("rejects prompt + max_tokens > max_seq_len", function()
            local pool = tl.PrefixPool(4)
            assert.has_error(function() model:generate_with_pool(pool, A, { max_tokens = 119 }) end,
                "bad argument 'max_tokens' to generate_with_pool (prompt length 10 + max_tokens 119 exceeds max_seq_len 128)")
        end)

        it("rejects a missing pool, an empty prompt and out-of-vocab ids", function()
            local pool = tl.PrefixPool(4)
            assert.has_error(function() model:generate_with_pool(nil, A) end,
                "bad argument 'pool' to generate_with_pool (expected a tinyloop.PrefixPool, got nil)")
            assert.has_error(function() model:generate_with_pool(pool, {}) end,
                "bad argument 'prompt' to generate_with_pool (prompt is empty)")
            assert.has_error(function() model:generate_with_pool(pool, { 1, 512 }) end,
                "bad argument 'prompt' to generate_with_pool (token 512 at index 2 is outside the vocab [0, 512))")
        end)
    end)

    describe("error table", function()
        it("'tinyloop.Model is closed; cannot call register_prefix' after close", function()
            local m = tl.Model(helpers.model_path)
            local pool = tl.PrefixPool(4)
            m:close()
            assert.has_error(function() m:register_prefix(pool, A) end,
                "tinyloop.Model is closed; cannot call register_prefix")
            assert.has_error(function() m:generate_with_pool(pool, A) end,
                "tinyloop.Model is closed; cannot call generate_with_pool")
        end)

        it("nil, 'out of memory', TL_ERR_KV_FULL when the prefixes need more KV than the arena has", function()
            local info = model:info()
            local block = info.kv_bytes / info.kv_blocks_total
            -- Room for 4 logical blocks (64 tokens) of 5 layers.
            local m = tl.Model(helpers.model_path, { kv_mem = 20 * block })
            local pool = tl.PrefixPool(8)
            assert.are.equal(30, m:register_prefix(pool, range(100, 129)))
            assert.are.equal(30, m:register_prefix(pool, range(200, 229)))
            local n, err, code = m:register_prefix(pool, range(300, 329))
            assert.is_nil(n)
            assert.truthy(err:find("^out of memory"), err)
            assert.are.equal(tl.lib.C.TL_ERR_KV_FULL, code)
            assert.are.equal(2, pool:size())
            m:close()
        end)

        it("register_prefix returns 0 for a nil pool or no tokens, or more than max_seq_len", function()
            local pool = tl.PrefixPool(4)
            assert.are.equal(0, model:register_prefix(nil, A))
            assert.are.equal(0, model:register_prefix(pool, {}))
            local n, why = model:register_prefix(pool, range(3, 131))
            assert.are.equal(0, n)
            assert.are.equal("prefix length 129 exceeds max_seq_len 128", why)
            assert.are.equal(0, pool:size())
        end)

        it("register_prefix returns 0 when the build fails (a vocab-only model)", function()
            local m = tl.Model(helpers.model_path, { vocab_only = true })
            local n, why = m:register_prefix(tl.PrefixPool(4), A)
            assert.are.equal(0, n)
            assert.truthy(why:find("vocab_only", 1, true))
            m:close()
        end)

        it("full prefill cost when cache_window differs between register and generate", function()
            local pool = tl.PrefixPool(4)
            model:register_prefix(pool, A, { cache_window = 16 })
            local computed = prefill_of(function()
                return model:generate_with_pool(pool, A, greedy)
            end)
            assert.are.equal(10, computed)
        end)

        it("entries disappear when capacity is exceeded, the shortest first", function()
            local pool = tl.PrefixPool(1)
            model:register_prefix(pool, A)
            model:register_prefix(pool, X)
            assert.are.equal(1, pool:size())
            assert.are.equal(4, pool:total_cached_tokens())
            local _, saved = prefill_of(function()
                return model:generate_with_pool(pool, concat(A, { 200 }), greedy)
            end)
            assert.is_true(saved < 10)
        end)

        it("register_prefix raises on misuse rather than returning 0", function()
            local pool = tl.PrefixPool(4)
            assert.has_error(function() model:register_prefix("pool", A) end,
                "bad argument 'pool' to register_prefix (expected a tinyloop.PrefixPool, got string)")
            assert.has_error(function() model:register_prefix(pool, { 1, 600 }) end,
                "bad argument 'tokens' to register_prefix (token 600 at index 2 is outside the vocab [0, 512))")
            assert.has_error(function() model:register_prefix(pool, A, { loops = -2 }) end,
                "bad argument 'loops' to register_prefix (expected an integer >= 0, got -2)")
            assert.has_error(function() model:register_prefix(pool, A, { cache_window = 1.5 }) end,
                "bad argument 'cache_window' to register_prefix (expected an integer >= 0, got 1.5)")
        end)
    end)

    describe("lifetime", function()
        it("a pool outliving its model reports size 0 and frees cleanly", function()
            local m = tl.Model(helpers.model_path)
            local pool = tl.PrefixPool(4)
            m:register_prefix(pool, A)
            m:close()
            assert.are.equal(0, pool:size())
            assert.are.equal(0, pool:total_cached_tokens())
            pool:free()
        end)

        it("a pool freed before its model releases its KV", function()
            local pool = tl.PrefixPool(4)
            model:register_prefix(pool, A)
            assert.is_true(model:stats().blocks_used > base.blocks_used)
            pool:free()
            assert.are.equal(base.blocks_used, model:stats().blocks_used)
            assert.are.same(plain(A), concat(A, model:generate(A, greedy)))
        end)

        -- Built in a function of their own, so no dead stack slot of this
        -- frame keeps the dropped object alive.
        local function pool_of_dropped_model()
            local m = tl.Model(helpers.model_path)
            local pool = tl.PrefixPool(2)
            m:register_prefix(pool, A)
            return pool
        end

        local function model_of_dropped_pool()
            local m = tl.Model(helpers.model_path)
            m:register_prefix(tl.PrefixPool(2), A)
            return m
        end

        it("a pool outlives a collected model", function()
            for _ = 1, 10 do
                local pool = pool_of_dropped_model()
                collectgarbage()
                collectgarbage()
                assert.are.equal(0, pool:size())
            end
        end)

        it("a model outlives a collected pool, which releases its KV", function()
            for _ = 1, 10 do
                local m = model_of_dropped_pool()
                collectgarbage()
                collectgarbage()
                assert.are.equal(base.blocks_used, m:stats().blocks_used)
            end
        end)

        it("a pool and a model collected together do not crash, in either creation order", function()
            for round = 1, 20 do
                if round % 2 == 0 then
                    pool_of_dropped_model()
                else
                    model_of_dropped_pool()
                end
                local m = tl.Model(helpers.model_path)
                local pool = tl.PrefixPool(2)
                if round % 4 < 2 then
                    m:register_prefix(pool, A)
                end
                m, pool = nil, nil -- luacheck: ignore
                collectgarbage()
            end
        end)

        it("a pool bound to one model is refused by another", function()
            local other = tl.Model(helpers.model_path)
            local pool = tl.PrefixPool(4)
            model:register_prefix(pool, A)
            local n, why = other:register_prefix(pool, X)
            assert.are.equal(0, n)
            assert.are.equal("pool is bound to another model", why)
            other:close()
        end)
    end)

    describe(":stats()", function()
        it("counts lookups, hits, registrations and evictions", function()
            local pool = tl.PrefixPool(1)
            model:register_prefix(pool, A)
            model:register_prefix(pool, X)
            model:generate_with_pool(pool, concat(X, { 200 }), greedy)
            local s = pool:stats()
            assert.are.same({ size = 1, capacity = 1, policy = "shortest", total_cached_tokens = 4, lookups = 1,
                hits = 1, hit_tokens = 4, registrations = 2, evictions = 1 }, s)
        end)

        it("switches to least-recently-used eviction with set_policy('lru')", function()
            local pool = tl.PrefixPool(2)
            pool:set_policy("lru")
            model:register_prefix(pool, B)
            model:register_prefix(pool, A)
            model:generate_with_pool(pool, concat(B, { 300 }), greedy) -- B used last (A is longer, not matched)
            model:register_prefix(pool, X)
            assert.are.equal(2, pool:size())
            assert.are.equal(10, pool:total_cached_tokens()) -- A (least recently used) went, not B
            assert.are.equal("lru", pool:stats().policy)
            assert.has_error(function() pool:set_policy("fifo") end,
                "bad argument 'policy' to set_policy (expected \"shortest\", \"lru\" or \"cost\", got \"fifo\")")
        end)
    end)
end)


describe("tinyloop.PrefixPool on a looped model", function()
    local tl = require "tinyloop"
    local model

    setup(function()
        model = tl.Model(helpers.looped_model())
    end)

    teardown(function()
        model:close()
    end)

    local P = range(10, 29)
    local greedy = { max_tokens = 6, temperature = 0 }

    local function saved_by(fn)
        local s0 = model:stats()
        fn()
        return model:stats().prefill_tokens_saved - s0.prefill_tokens_saved
    end

    it("has a loop block [1, 3) run twice by default", function()
        local i = model:info()
        assert.are.same({ 1, 3, 2 }, { i.loop_start, i.loop_end, i.loop_default })
    end)

    it("misses when loops differ between register and generate, even for identical tokens", function()
        local pool = tl.PrefixPool(4)
        model:register_prefix(pool, P, { loops = 2 })
        local prompt = concat(P, { 40 })
        assert.are.equal(0, saved_by(function()
            model:generate_with_pool(pool, prompt, { max_tokens = 6, temperature = 0, loops = 3 })
        end))
        assert.are.equal(20, saved_by(function()
            model:generate_with_pool(pool, concat(P, { 41 }), { max_tokens = 6, temperature = 0, loops = 2 })
        end))
    end)

    it("treats loops = 0 as the model's default depth (2 here)", function()
        local pool = tl.PrefixPool(4)
        model:register_prefix(pool, P, { loops = 2 })
        assert.are.equal(20, model:register_prefix(pool, P))
        assert.are.equal(1, pool:size())
    end)

    it("keeps entries at different depths apart", function()
        local pool = tl.PrefixPool(4)
        model:register_prefix(pool, P, { loops = 1 })
        model:register_prefix(pool, P, { loops = 3 })
        assert.are.equal(2, pool:size())
        assert.are.equal(40, pool:total_cached_tokens())
    end)

    it("gives the same tokens with and without the pool at each depth", function()
        local pool = tl.PrefixPool(4)
        for loops = 1, 3 do
            model:register_prefix(pool, P, { loops = loops })
            local o = { max_tokens = 6, temperature = 0, loops = loops }
            local want = concat(P, model:generate(P, { max_tokens = 6, temperature = 0, loops = loops,
                no_cache = true }))
            assert.are.same(want, model:generate_with_pool(pool, P, o))
        end
    end)

    it("resumes a prompt at another depth exactly as generating at that depth", function()
        local h = model:build_resume_handle(P)
        for loops = 1, 4 do
            assert.are.same(model:generate(P, { max_tokens = 6, temperature = 0, loops = loops, no_cache = true }),
                model:resume_generate(h, { max_tokens = 6, temperature = 0, loops = loops }))
        end
        h:free()
        assert.is_truthy(greedy)
    end)
end)
