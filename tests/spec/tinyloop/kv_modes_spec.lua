-- KV cache modes through the Lua API on stories260K: kv_type checking,
-- the mode named by info() and stats(), bytes per token in each mode, the
-- KV cost of a named pool entry (pool:entry_bytes) and cached ==
-- uncached generation in the quantized modes. stories260K's head_dim is 8,
-- so its q8/q4 rows have one scale per 8 values (the group is cut to the
-- head). tests/c/test_kv_modes.c covers the codecs themselves.
local helpers = require "helpers"

local concat = helpers.concat

describe("KV cache modes", function()
    if helpers.skip_without_model() then
        return
    end
    local tl = require "tinyloop"
    local path = helpers.model_path
    local greedy = { max_tokens = 16, temperature = 0 }
    local text = "Once upon a time there was a little girl named Lily. She liked to play in the park."

    -- Models opened by a test, closed after it whatever happened.
    local opened = {}
    local function open(opts)
        local m = tl.Model(path, opts)
        opened[#opened + 1] = m
        return m
    end

    after_each(function()
        for i = #opened, 1, -1 do
            opened[i]:close()
            opened[i] = nil
        end
    end)

    describe("kv_type", function()
        it("rejects a value that is not a string, naming it", function()
            assert.has_error(function() tl.Model(path, { kv_type = 2 }) end,
                "bad argument 'kv_type' to Model (" .. tl.KV_MODE_EXPECTED .. ", got 2)")
            assert.has_error(function() tl.Model(path, { kv_type = true }) end,
                "bad argument 'kv_type' to Model (" .. tl.KV_MODE_EXPECTED .. ", got true)")
        end)

        it("rejects a string that is not a mode, naming it", function()
            for _, v in ipairs { "q3", "Q8", "", "q8,", ",f16", "q8,f16,f16", "h:", "h:q3", "h,q8", "f16 " } do
                assert.has_error(function() tl.Model(path, { kv_type = v }) end,
                    "bad argument 'kv_type' to Model (" .. tl.KV_MODE_EXPECTED .. ", got " .. string.format("%q", v)
                    .. ")")
            end
        end)

        it("opens each mode, named canonically by info().kv_type and stats().kv_mode", function()
            local want = { f16 = "f16", f32 = "f32", q8 = "q8", q4 = "q4", ["q8,f16"] = "q8,f16",
                ["f16,q4"] = "f16,q4", h = "h:f16", ["h:q8"] = "h:q8", ["h:q4"] = "h:q4" }
            for mode, name in pairs(want) do
                local m = open { kv_type = mode }
                local i = m:info()
                assert.are.equal(name, i.kv_type, mode)
                assert.are.equal(name, m:stats().kv_mode, mode)
                assert.are.equal(mode:sub(1, 1) == "h", i.kv_store_h, mode)
            end
        end)

        it("wins over the environment, which the engine reads when kv_type is unset", function()
            local code = "local tl = require 'tinyloop'; local p = '" .. path .. "'; "
                .. "local a = tl.Model(p); local b = tl.Model(p, { kv_type = 'f32' }); "
                .. "io.write(a:stats().kv_mode, ' ', b:stats().kv_mode)"
            local out, ok = helpers.run("TINYLOOP_KV_INT8=1 " .. helpers.luajit_cmd() .. " -e \"" .. code .. "\"")
            assert.is_true(ok, out)
            assert.are.equal("q8 f32", out)
            out, ok = helpers.run("TINYLOOP_KV_INT4=1 " .. helpers.luajit_cmd() .. " -e \"" .. code .. "\"")
            assert.is_true(ok, out)
            assert.are.equal("q4 f32", out)
        end)
    end)

    describe("bytes per token", function()
        it("orders q4 < q8 < f16 < f32, the same from info() and stats() of a model in each mode", function()
            local table_of = open():info().kv_mode_bytes
            assert.is_true(table_of.q4 < table_of.q8, "q4 < q8")
            assert.is_true(table_of.q8 < table_of.f16, "q8 < f16")
            assert.is_true(table_of.f16 < table_of.f32, "f16 < f32")
            assert.are.equal(2 * table_of.f16, table_of.f32)
            for _, mode in ipairs { "f16", "f32", "q8", "q4", "h:f16", "h:q8" } do
                local m = open { kv_type = mode }
                assert.are.equal(table_of[mode], m:info().kv_token_bytes, mode)
                assert.are.equal(table_of[mode], m:stats().kv_token_bytes, mode)
            end
        end)

        it("puts more tokens in the same kv_mem in a smaller mode", function()
            local mem = 512 * 1024
            local f16 = open { kv_type = "f16", kv_mem = mem }:info()
            local q4 = open { kv_type = "q4", kv_mem = mem }:info()
            assert.is_true(q4.kv_blocks_total > f16.kv_blocks_total)
        end)
    end)

    describe("pool:entry_bytes", function()
        -- The blocks an entry holds, counted from the radix tree of a model
        -- whose cache holds nothing else.
        local function tree_blocks(m)
            local n = 0
            for _, node in ipairs(m:cache_nodes()) do
                n = n + node.n_blocks
            end
            return n
        end

        local function entry_in(mode)
            local m = open { kv_type = mode }
            local pool = tl.PrefixPool(4)
            local toks = m:tokenize(text)
            assert.are.equal(#toks, m:register_prefix(pool, toks, { name = "system" }))
            local bytes, blocks = pool:entry_bytes("system")
            return bytes, blocks, m, pool, toks
        end

        it("is blocks x block bytes of the model's mode, the blocks the entry holds", function()
            for _, mode in ipairs { "f16", "q8", "q4", "h:q8" } do
                local bytes, blocks, m, _, toks = entry_in(mode)
                local i = m:info()
                assert.are.equal(tree_blocks(m), blocks, mode)
                assert.are.equal(m:kv_blocks(#toks), blocks, mode)
                assert.are.equal(blocks * i.kv_bytes / i.kv_blocks_total, bytes, mode)
                -- block rounding: never less than the tokens' own cost
                assert.is_true(bytes >= #toks * i.kv_token_bytes, mode)
            end
        end)

        it("follows the mode: the same prompt costs q4 < q8 < f16 < f32", function()
            local f32, b32 = entry_in("f32")
            local f16, b16 = entry_in("f16")
            local q8, b8 = entry_in("q8")
            local q4, b4 = entry_in("q4")
            assert.are.same({ b16, b16, b16 }, { b32, b8, b4 }) -- same blocks, smaller blocks
            assert.is_true(q4 < q8 and q8 < f16 and f16 < f32, table.concat({ q4, q8, f16, f32 }, " "))
        end)

        it("names the entry registered last under a name, also by register_prefix_async", function()
            local m = open { kv_type = "q8" }
            local pool = tl.PrefixPool(4)
            local long, short = m:tokenize(text), m:tokenize("Once upon a time")
            m:register_prefix(pool, long, { name = "a" })
            local la = pool:entry_bytes("a")
            m:register_prefix(pool, short, { name = "a" })
            local _, sb = pool:entry_bytes("a")
            assert.are.equal(m:kv_blocks(#short), sb)
            assert.is_true(pool:entry_bytes("a") < la)
            local id = m:register_prefix_async(pool, concat(short, { 300, 301 }), { name = "b" })
            assert.are.equal(m:kv_blocks(#short + 2), select(2, pool:entry_bytes("b")))
            -- no engine thread here: any generation steps the scheduler
            m:generate(m:tokenize("Lily"), { max_tokens = 2, temperature = 0 })
            assert.are.equal("done", m:request_state(id))
            m:release_request(id)
            assert.are.equal(3, pool:size())
        end)

        it("raises naming the value for an unknown name or a name that is not a string", function()
            local _, _, m, pool, toks = entry_in("q8")
            assert.has_error(function() pool:entry_bytes("nope") end,
                "bad argument 'name' to entry_bytes (no entry named \"nope\" in this pool)")
            assert.has_error(function() pool:entry_bytes(7) end,
                "bad argument 'name' to entry_bytes (expected a string, got 7)")
            assert.has_error(function() tl.PrefixPool(2):entry_bytes("system") end,
                "bad argument 'name' to entry_bytes (no entry named \"system\" in this pool)")
            assert.has_error(function() m:register_prefix(pool, toks, { name = 7 }) end,
                "bad argument 'name' to register_prefix (expected a string, got 7)")
            assert.has_error(function() m:register_prefix_async(pool, toks, { name = {} }) end)
        end)

        it("forgets the names when the model closes or the pool is freed", function()
            local _, _, m, pool = entry_in("q4")
            m:close()
            assert.has_error(function() pool:entry_bytes("system") end,
                "bad argument 'name' to entry_bytes (no entry named \"system\" in this pool)")
            local _, _, _, pool2 = entry_in("q4")
            pool2:free()
            assert.has_error(function() pool2:entry_bytes("system") end,
                "tinyloop.PrefixPool is freed; cannot call entry_bytes")
        end)
    end)

    describe("generation", function()
        for _, mode in ipairs { "q8", "q4", "q8,f16", "h:q8" } do
            it("gives the same tokens cached and uncached in " .. mode, function()
                local m = open { kv_type = mode }
                local prompt = m:tokenize(text)
                local o = { no_cache = true }
                for k, v in pairs(greedy) do
                    o[k] = v
                end
                local uncached = concat(prompt, m:generate(prompt, o))
                -- a registered prefix of the prompt, the rest prefilled after it
                local pool = tl.PrefixPool(4)
                m:register_prefix(pool, { unpack(prompt, 1, 10) }, { name = "head" })
                local s0 = m:stats()
                assert.are.same(uncached, m:generate_with_pool(pool, prompt, greedy))
                local s1 = m:stats()
                assert.are.equal(10, s1.prefill_tokens_saved - s0.prefill_tokens_saved)
                -- the whole prompt from the radix cache (the call above left it there)
                assert.are.same(uncached, concat(prompt, m:generate(prompt, greedy)))
                assert.is_true(m:stats().prefill_tokens_saved - s1.prefill_tokens_saved >= #prompt - 1)
            end)
        end
    end)
end)
