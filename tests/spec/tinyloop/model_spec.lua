-- tinyloop.Model on stories260K: construction, tokenizer, generation,
-- streaming, handles, statistics, argument checks and close().
local helpers = require "helpers"
local ffi = require "ffi"

describe("tinyloop.Model", function()
    if helpers.skip_without_model() then
        return
    end
    local tl = require "tinyloop"
    local cjson = require "cjson"
    local path = helpers.model_path
    local model

    setup(function()
        model = tl.Model(path)
    end)

    teardown(function()
        model:close()
    end)

    local once = { 1, 403, 407, 261, 378 } -- BOS "Once upon a time"
    local greedy = { max_tokens = 8, temperature = 0 }

    describe("construction", function()
        it("opens a GGUF file and exposes vocab size, context and special ids", function()
            assert.are.equal(512, model.n_vocab)
            assert.are.equal(128, model.max_seq_len)
            assert.are.equal(1, model.bos)
            assert.are.equal(2, model.eos)
            assert.are.equal("llama", model:info().arch)
        end)

        it("is also available as tl.open", function()
            local m = tl.open(path, { max_seq_len = 64 })
            assert.are.equal(64, m.max_seq_len)
            m:close()
        end)

        it("applies every load option", function()
            local m = tl.Model(path, { max_seq_len = 96, n_threads = 1, kv_block_size = 8, kv_type = "f32",
                kv_mem = 1024 * 1024 })
            local i = m:info()
            assert.are.same({ 96, 1, 8, "f32" }, { i.max_seq_len, i.n_threads, i.kv_block_size, i.kv_type })
            assert.is_true(i.kv_bytes <= 1024 * 1024)
            m:close()
        end)

        it("loads the tokenizer only with vocab_only", function()
            local m = tl.Model(path, { vocab_only = true })
            assert.are.same(once, m:tokenize("Once upon a time"))
            m:close()
        end)

        it("sets a loop block on a plain model with loop_start/loop_end/loop_default", function()
            local m = tl.Model(path, { loop_start = 1, loop_end = 3, loop_default = 2 })
            local i = m:info()
            assert.are.same({ 1, 3, 2 }, { i.loop_start, i.loop_end, i.loop_default })
            m:close()
        end)

        it("reports a mixture-of-experts model's experts in info() (0 for a dense one)", function()
            local moe = helpers.tmpdir() .. "/moe.gguf"
            local out, ok = helpers.run("'" .. helpers.root .. "/bin/tl-gen-model' '" .. moe
                .. "' --arch qwen3moe --experts 6 --experts-used 2 --ff 96")
            assert(ok, "tl-gen-model failed: " .. out)
            local m = tl.Model(moe)
            local i = m:info()
            assert.are.same({ "qwen3moe", 6, 2, 96 }, { i.arch, i.n_expert, i.n_expert_used, i.n_ff_expert })
            assert.are.equal(6, #m:generate({ 1, 5, 9 }, { max_tokens = 6, temperature = 0 }))
            m:close()
            assert.are.same({ 0, 0 }, { model:info().n_expert, model:info().n_expert_used })
        end)

        it("takes repack = \"off\" and, with AVX512_BF16, \"bf16\" (the same 8 greedy tokens here)", function()
            local off = tl.Model(path, { repack = "off" })
            off:close()
            local ok, m = pcall(tl.Model, path, { repack = "bf16" })
            if not ok then -- a CPU without AVX512_BF16: refused, naming it
                assert.truthy(tostring(m):find("AVX512_BF16", 1, true), m)
                return
            end
            local got = m:generate(once, greedy)
            m:close()
            assert.are.same(model:generate(once, greedy), got)
        end)

        it("raises with the file name when the file cannot be opened", function()
            local ok, err = pcall(tl.Model, "/nonexistent/model.gguf")
            assert.is_false(ok)
            assert.truthy(err:find("/nonexistent/model.gguf", 1, true), err)
        end)

        it("rejects bad option values naming the option and value", function()
            assert.has_error(function() tl.Model(42) end,
                "bad argument 'path' to Model (expected a string, got number)")
            assert.has_error(function() tl.Model(path, { max_seq_len = -1 }) end,
                "bad argument 'max_seq_len' to Model (expected an integer >= 0, got -1)")
            assert.has_error(function() tl.Model(path, { n_threads = 1.5 }) end,
                "bad argument 'n_threads' to Model (expected an integer >= 0, got 1.5)")
            assert.has_error(function() tl.Model(path, { kv_type = "q3" }) end,
                "bad argument 'kv_type' to Model (" .. tl.KV_MODE_EXPECTED .. ", got \"q3\")")
            assert.has_error(function() tl.Model(path, { repack = "fast" }) end,
                "bad argument 'repack' to Model (expected \"on\", \"off\" or \"bf16\", got \"fast\")")
            assert.has_error(function() tl.Model(path, { max_seqlen = 4 }) end,
                "bad argument 'opts' to Model (unknown option \"max_seqlen\")")
            assert.has_error(function() tl.Model(path, 5) end,
                "bad argument 'opts' to Model (expected a table, got number)")
        end)
    end)

    describe(":tokenize()", function()
        it("adds BOS by default and not with add_special = false", function()
            assert.are.same(once, model:tokenize("Once upon a time"))
            assert.are.same({ 403, 407, 261, 378 }, model:tokenize("Once upon a time", { add_special = false }))
        end)

        it("returns int32_t cdata and its length with as_cdata", function()
            local c, n = model:tokenize("Once upon a time", { as_cdata = true })
            assert.are.equal(5, n)
            assert.is_true(ffi.istype("int32_t[?]", c))
            assert.are.equal(378, c[4])
        end)

        it("grows its buffer for long texts", function()
            local text = string.rep("Once upon a time ", 200)
            assert.is_true(#model:tokenize(text) > 600)
        end)

        it("rejects a non-string text", function()
            assert.has_error(function() model:tokenize(12) end,
                "bad argument 'text' to tokenize (expected a string, got number)")
        end)
    end)

    describe(":detokenize()", function()
        it("turns ids back into text, skipping control tokens", function()
            assert.are.equal("Once upon a time", model:detokenize(once))
        end)

        it("accepts int32_t arrays, and pointers with an explicit length", function()
            local arr = ffi.new("int32_t[5]", once)
            assert.are.equal("Once upon a time", model:detokenize(arr))
            assert.are.equal("Once upon", model:detokenize(ffi.cast("int32_t *", arr), 3))
            assert.has_error(function() model:detokenize(ffi.cast("int32_t *", arr)) end,
                "bad argument 'ids' to detokenize (an int32_t pointer needs its length in opts.n)")
        end)

        it("rejects ids outside the vocab naming index and value", function()
            assert.has_error(function() model:detokenize({ 1, 600 }) end,
                "bad argument 'ids' to detokenize (token 600 at index 2 is outside the vocab [0, 512))")
            assert.has_error(function() model:detokenize({ 1, 2.5 }) end,
                "bad argument 'ids' to detokenize (token 2.5 at index 2 is not an integer)")
            assert.has_error(function() model:detokenize({ 1, "x" }) end,
                "bad argument 'ids' to detokenize (token \"x\" at index 2 is not an integer)")
            assert.has_error(function() model:detokenize(ffi.new("int64_t[2]")) end,
                "bad argument 'ids' to detokenize (expected int32_t cdata, got ctype<int64_t [2]>)")
            assert.has_error(function() model:detokenize("abc") end,
                "bad argument 'ids' to detokenize (expected a table or int32_t cdata of token ids, got string)")
        end)
    end)

    describe(":piece()", function()
        it("gives the text of one token", function()
            assert.are.equal(" upon", model:piece(407))
        end)
    end)

    describe(":generate()", function()
        local ref = cjson.decode(helpers.read(helpers.ref_path))

        it("matches llama.cpp's greedy tokens for every reference prompt", function()
            for _, r in ipairs(ref) do
                assert.are.same(r.prompt_ids, model:tokenize(r.prompt))
                local out = model:generate(r.prompt_ids, { max_tokens = #r.gen_ids, temperature = 0 })
                assert.are.same(r.gen_ids, out)
                assert.are.equal(r.prompt .. r.gen_text, model:detokenize(helpers.concat(r.prompt_ids, out)))
            end
        end)

        it("accepts int32_t cdata prompts and returns cdata with as_cdata", function()
            local p = ffi.new("int32_t[?]", 5, once)
            local c, n = model:generate(p, { max_tokens = 8, temperature = 0, as_cdata = true })
            assert.are.equal(8, n)
            local t = {}
            for i = 0, n - 1 do
                t[i + 1] = c[i]
            end
            assert.are.same(model:generate(once, greedy), t)
            assert.are.same(model:generate(once, greedy), model:generate(ffi.cast("const int32_t *", p),
                { n = 5, max_tokens = 8, temperature = 0 }))
        end)

        it("samples with docs/prefix-pool.md's defaults (temperature 1.0, top_k 50), reproducibly per seed", function()
            local a = model:generate(once, { max_tokens = 16, seed = 7 })
            assert.are.same(a, model:generate(once, { max_tokens = 16, seed = 7 }))
            assert.are.equal(16, #a)
        end)

        it("rejects bad arguments naming the argument and value", function()
            assert.has_error(function() model:generate({}, greedy) end,
                "bad argument 'prompt' to generate (prompt is empty)")
            assert.has_error(function() model:generate({ 1, 9999 }, greedy) end,
                "bad argument 'prompt' to generate (token 9999 at index 2 is outside the vocab [0, 512))")
            assert.has_error(function() model:generate({ 1, -1 }, greedy) end,
                "bad argument 'prompt' to generate (token -1 at index 2 is outside the vocab [0, 512))")
            assert.has_error(function() model:generate(once, { max_tokens = -4 }) end,
                "bad argument 'max_tokens' to generate (expected an integer >= 1, got -4)")
            assert.has_error(function() model:generate(once, { max_tokens = 2.5 }) end,
                "bad argument 'max_tokens' to generate (expected an integer >= 1, got 2.5)")
            assert.has_error(function() model:generate(once, { max_tokens = 124 }) end,
                "bad argument 'max_tokens' to generate (prompt length 5 + max_tokens 124 exceeds max_seq_len 128)")
            assert.has_error(function() model:generate(once, { temperature = "hot" }) end,
                "bad argument 'temperature' to generate (expected a number, got \"hot\")")
            assert.has_error(function() model:generate(once, { loops = -1 }) end,
                "bad argument 'loops' to generate (expected an integer >= 0, got -1)")
            assert.has_error(function() model:generate(once, { max_tokns = 3 }) end,
                "bad argument 'opts' to generate (unknown option \"max_tokns\")")
            assert.has_error(function() model:generate(once, { ignore_eos = 1 }) end,
                "bad argument 'ignore_eos' to generate (expected a boolean, got 1)")
        end)

        it("passes sampler failures of C through with its message", function()
            assert.has_error(function() model:generate(once, { top_p = -2 }) end)
        end)
    end)

    describe(":stream()", function()
        it("yields the same tokens as generate, one at a time", function()
            local got = {}
            for tok in model:stream(once, { max_tokens = 20, temperature = 0 }) do
                got[#got + 1] = tok
            end
            assert.are.same(model:generate(once, { max_tokens = 20, temperature = 0 }), got)
        end)

        it("interleaves several streams on one model", function()
            local a, sa = model:stream(once, { max_tokens = 10, temperature = 0 })
            local b, sb = model:stream({ 1, 317, 381, 261 }, { max_tokens = 10, temperature = 0 })
            local ta, tb = {}, {}
            for _ = 1, 10 do
                ta[#ta + 1] = a(sa)
                tb[#tb + 1] = b(sb)
            end
            assert.is_nil(a(sa))
            assert.is_nil(b(sb))
            assert.are.same(model:generate(once, { max_tokens = 10, temperature = 0 }), ta)
            assert.are.same(model:generate({ 1, 317, 381, 261 }, { max_tokens = 10, temperature = 0 }), tb)
        end)

        it("counts its lookup in a pool's statistics when given one", function()
            local pool = tl.PrefixPool(4)
            model:register_prefix(pool, once)
            local before = pool:stats().lookups
            for _ in model:stream(helpers.concat(once, { 432, 383 }), { max_tokens = 4, temperature = 0,
                pool = pool }) do
            end
            local s = pool:stats()
            assert.are.equal(before + 1, s.lookups)
            assert.is_true(s.hit_tokens >= 5)
        end)

        it("releases an abandoned stream's request when it is collected", function()
            local f, s = model:stream(once, { max_tokens = 30, temperature = 0 })
            f(s)
            assert.are.equal(1, model:stats().requests_active)
            f, s = nil, nil -- luacheck: ignore
            collectgarbage()
            collectgarbage()
            assert.are.equal(0, model:stats().requests_active)
        end)

        it("rejects bad arguments before submitting", function()
            assert.has_error(function() model:stream({}, greedy) end,
                "bad argument 'prompt' to stream (prompt is empty)")
            assert.has_error(function() model:stream(once, { pool = {} }) end,
                "bad argument 'pool' to stream (expected a tinyloop.PrefixPool, got table)")
        end)
    end)

    describe(":build_prefix_cache() / :generate_from_prefix_cache()", function()
        it("generates after a prefix plus suffix exactly as plain generation", function()
            local pf = model:build_prefix_cache({ 1, 403, 407 })
            assert.are.equal(3, pf:len())
            local out = model:generate_from_prefix_cache(pf, { suffix = { 261, 378 }, max_tokens = 8,
                temperature = 0 })
            assert.are.same(model:generate(once, greedy), out)
            assert.are.same(model:generate({ 1, 403, 407 }, greedy),
                model:generate_from_prefix_cache(pf, greedy))
            pf:free()
            assert.is_true(pf:is_freed())
            assert.has_error(function() model:generate_from_prefix_cache(pf, greedy) end,
                "tinyloop.Prefix is freed; cannot call generate_from_prefix_cache")
        end)

        it("rejects a handle of another kind or model", function()
            local other = tl.Model(path)
            local pf = other:build_prefix_cache(once)
            assert.has_error(function() model:generate_from_prefix_cache(pf, greedy) end,
                "bad argument 'handle' to generate_from_prefix_cache (the tinyloop.Prefix belongs to another model)")
            assert.has_error(function() model:generate_from_prefix_cache({}, greedy) end,
                "bad argument 'handle' to generate_from_prefix_cache (expected a tinyloop.Prefix, got table)")
            other:close()
        end)
    end)

    describe(":build_resume_handle() / :resume_generate()", function()
        it("regenerates the prompt's continuation on a model without a loop block", function()
            local h = model:build_resume_handle(once)
            assert.are.same(model:generate(once, greedy), model:resume_generate(h, greedy))
            h:free()
        end)
    end)

    describe(":stats()", function()
        it("reports cache and block counters", function()
            local s = model:stats()
            for _, k in ipairs { "lookups", "hits", "hit_tokens", "prefill_tokens", "prefill_tokens_saved",
                "generated_tokens", "requests_finished", "nodes", "cached_tokens", "blocks_total", "blocks_free",
                "blocks_used", "requests_active" } do
                assert.is_number(s[k], k)
            end
            assert.are.equal(s.blocks_total, s.blocks_free + s.blocks_used)
        end)
    end)

    describe(":set_evict_weights()", function()
        it("accepts the four weights and rejects unknown ones", function()
            model:set_evict_weights { recency = 1, hits = 0, tokens = 0, depth = 0 }
            assert.has_error(function() model:set_evict_weights { age = 1 } end,
                "bad argument 'opts' to set_evict_weights (unknown option \"age\")")
        end)
    end)

    describe(":close()", function()
        local names = { "generate", "tokenize", "detokenize", "piece", "register_prefix", "generate_with_pool",
            "build_prefix_cache", "generate_from_prefix_cache", "build_resume_handle", "resume_generate", "stream",
            "stats", "info", "set_evict_weights" }

        it("makes every method raise 'tinyloop.Model is closed; cannot call <name>'", function()
            local m = tl.Model(path)
            m:close()
            for _, name in ipairs(names) do
                assert.has_error(function() m[name](m, once) end, "tinyloop.Model is closed; cannot call " .. name)
            end
            assert.is_true(m:is_closed())
        end)

        it("also stops methods taken before the close", function()
            local m = tl.Model(path)
            local gen = m.generate
            m:close()
            assert.has_error(function() gen(m, once) end, "tinyloop.Model is closed; cannot call generate")
        end)

        it("ends a running stream with the same error", function()
            local m = tl.Model(path)
            local f, s = m:stream(once, { max_tokens = 10 })
            f(s)
            m:close()
            assert.has_error(function() f(s) end, "tinyloop.Model is closed; cannot call stream")
        end)

        it("frees the model's prefix and resume handles first", function()
            local m = tl.Model(path)
            local pf = m:build_prefix_cache(once)
            local rh = m:build_resume_handle(once)
            m:close()
            assert.is_true(pf:is_freed())
            assert.is_true(rh:is_freed())
            pf:free() -- no double free
        end)

        it("lets prefix handles keep their model alive, and both be collected together", function()
            local function handle_only()
                local m = tl.Model(path)
                return m:build_prefix_cache(once), m:build_resume_handle(once)
            end
            for _ = 1, 10 do
                local pf, rh = handle_only()
                collectgarbage()
                assert.are.same(model:generate(once, greedy), pf.model:generate_from_prefix_cache(pf, greedy))
                assert.is_false(rh:is_freed())
                pf, rh = nil, nil -- luacheck: ignore
                collectgarbage()
            end
        end)

        it("is idempotent", function()
            local m = tl.Model(path)
            m:close()
            m:close()
            assert.are.equal("tinyloop.Model (" .. path .. ", closed)", tostring(m))
        end)
    end)
end)
