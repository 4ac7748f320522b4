-- The Lua error convention (lua/README.md, issue 16): misuse raises with
-- error(msg, 2); a runtime failure returns nil, message, code, the code
-- from the generated enum (C.TL_ERR_*), never matched from the message.
local helpers = require "helpers"

local range = helpers.range

describe("tinyloop error convention", function()
    local tl = require "tinyloop"
    local lib = require "tinyloop.lib"
    local C = lib.C

    it("reads status codes from the generated cdef, not a copy", function()
        assert.are.equal(tonumber(C.TL_ERR_KV_FULL), lib.status.ERR_KV_FULL)
        assert.are.equal(tonumber(C.TL_ERR_BUSY), lib.status.ERR_BUSY)
        assert.are.equal(0, lib.status.OK)
        assert.are.equal("TL_ERR_INVALID_ARG", lib.status_name[C.TL_ERR_INVALID_ARG])
    end)

    it("last_error_code() returns the code that went with last_error()", function()
        C.tl_pool_register(nil, nil, nil, 0, 0, 0)
        assert.are.equal(tonumber(C.TL_ERR_INVALID_ARG), lib.last_error_code())
        assert.truthy(lib.last_error():find("NULL"), lib.last_error())
    end)

    it("tl_pool_register returns a negative code on failure, like every other call", function()
        local pool = tl.PrefixPool(2)
        assert.are.equal(tonumber(C.TL_ERR_INVALID_ARG), C.tl_pool_register(nil, pool.h, nil, 0, 0, 0))
    end)

    if helpers.skip_without_model() then
        return
    end

    -- A model whose arena holds 4 blocks (64 tokens) of its 5 layers.
    local function small_model()
        local probe = tl.Model(helpers.model_path)
        local info = probe:info()
        probe:close()
        return tl.Model(helpers.model_path, { kv_mem = 20 * (info.kv_bytes / info.kv_blocks_total) })
    end

    it("generate returns nil, 'out of memory: ...', TL_ERR_KV_FULL when the KV arena cannot hold it", function()
        local m = small_model()
        local out, err, code = m:generate(range(100, 129), { max_tokens = 90, temperature = 0, ignore_eos = true })
        assert.is_nil(out)
        assert.truthy(err:find("^out of memory: "), err)
        assert.are.equal(tonumber(C.TL_ERR_KV_FULL), code)
        -- the model still works afterwards
        assert.are.equal(4, #m:generate(range(100, 109), { max_tokens = 4, temperature = 0, ignore_eos = true }))
        m:close()
    end)

    it("build_prefix_cache returns nil, err, code when the prefix cannot fit", function()
        local m = small_model()
        local pf, err, code = m:build_prefix_cache(range(3, 100))
        assert.is_nil(pf)
        assert.truthy(err:find("^out of memory: "), err)
        assert.are.equal(tonumber(C.TL_ERR_KV_FULL), code)
        m:close()
    end)

    it("misuse still raises, naming the argument and value", function()
        local m = tl.Model(helpers.model_path)
        assert.has_error(function() m:generate({ 1, 2 }, { max_tokns = 3 }) end)
        assert.has_error(function() m:generate({ 1, 2 }, { temperature = "hot" }) end)
        m:close()
    end)
end)


describe("Model:kv_blocks()", function()
    local tl = require "tinyloop"
    local C = require("tinyloop.lib").C

    if helpers.skip_without_model() then
        return
    end

    it("gives the blocks the engine says a request that can never fit needs, and the arena's total", function()
        local probe = tl.Model(helpers.model_path)
        local info = probe:info()
        probe:close()
        local m = tl.Model(helpers.model_path, { kv_mem = 20 * (info.kv_bytes / info.kv_blocks_total) })
        local total_now = m:info().kv_blocks_total
        local out, err, code = m:generate(range(100, 129), { max_tokens = 90, temperature = 0, ignore_eos = true })
        assert.is_nil(out)
        assert.are.equal(tonumber(C.TL_ERR_KV_FULL), code)
        local need, total = m:kv_blocks(30 + 90)
        -- the engine's message carries the same numbers (read here only to
        -- check the Lua rule against C; code never reads it)
        assert.truthy(err:find(string.format("needs %d blocks, %d of %d free", need, total, total), 1, true), err)
        assert.are.equal(total_now, total)
        assert.is_true(need > total)
        assert.is_true(m:kv_blocks(10 + 4) <= total)
        m:close()
    end)

    it("counts every layer once per loop at the requested depth", function()
        local m = tl.Model(helpers.model_path)
        local i = m:info()
        local core = i.loop_end - i.loop_start
        local bs = i.kv_block_size
        assert.are.equal(i.n_layer * 2, (m:kv_blocks(bs + 1)))
        assert.are.equal(core == 0 and i.n_layer or i.n_layer + 2 * core, (m:kv_blocks(1, 3)))
        assert.are.equal(0, (m:kv_blocks(0)))
        assert.has_error(function() m:kv_blocks(-1) end)
        m:close()
    end)
end)


-- stream, stream_text, chat and generate: a request that cannot be
-- submitted is a runtime failure (nil, err, code); misuse still raises.
describe("a request the busy queue refuses", function()
    local tl = require "tinyloop"
    local C = require("tinyloop.lib").C

    if helpers.skip_without_model() then
        return
    end

    local model, held

    -- Fills the synchronous scheduler's queue (max_queue 1024): streams
    -- submitted and never stepped stay queued.
    before_each(function()
        model = tl.Model(helpers.model_path)
        held = {}
        for i = 1, 1024 do
            local it, st = model:stream({ 1, 100 + i % 50 }, { max_tokens = 2 })
            assert.is_function(it)
            held[i] = st
        end
    end)

    after_each(function()
        model:close()
        held = nil
    end)

    local BUSY = tonumber(C.TL_ERR_BUSY)

    it("makes stream return nil, err, TL_ERR_BUSY", function()
        local it, err, code = model:stream({ 1, 2, 3 }, { max_tokens = 2 })
        assert.is_nil(it)
        assert.truthy(err:find("^stream: "), err)
        assert.are.equal(BUSY, code)
    end)

    it("makes stream_text return nil, err, TL_ERR_BUSY", function()
        local it, err, code = model:stream_text({ 1, 2, 3 }, { max_tokens = 2 })
        assert.is_nil(it)
        assert.truthy(err:find("^stream_text: "), err)
        assert.are.equal(BUSY, code)
    end)

    it("makes chat return nil, err, TL_ERR_BUSY", function()
        local text, err, code = model:chat({ { role = "user", content = "Hi" } }, { max_tokens = 2 })
        assert.is_nil(text)
        assert.truthy(err:find("^chat: "), err)
        assert.are.equal(BUSY, code)
    end)

    it("makes generate return nil, err, TL_ERR_BUSY", function()
        local out, err, code = model:generate({ 1, 2, 3 }, { max_tokens = 2 })
        assert.is_nil(out)
        assert.truthy(err:find("^generate: "), err)
        assert.are.equal(BUSY, code)
    end)

    it("still raises on misuse, at the caller, whatever the queue", function()
        local ok, err = pcall(function() local _ = model:stream({ 1, 2 }, { max_tokns = 2 }) end)
        assert.is_false(ok)
        assert.truthy(err:find("errors_spec.lua:%d+: bad argument 'opts' to stream"), err)
        ok, err = pcall(function() local _ = model:stream_text({ 1, 2 }, { max_tokens = 1000 }) end)
        assert.is_false(ok)
        assert.truthy(err:find("errors_spec.lua:%d+: bad argument 'max_tokens' to stream_text"), err)
        ok, err = pcall(function() local _ = model:chat({ { role = "user", content = "Hi" } }, { top_k = -1 }) end)
        assert.is_false(ok)
        assert.truthy(err:find("errors_spec.lua:%d+: bad argument 'top_k' to chat"), err)
    end)

    it("lets the queued streams run once the queue is drained", function()
        local n = 0
        for tok in tl.stream_next, held[1] do
            assert.is_number(tok)
            n = n + 1
        end
        assert.is_true(n >= 1 and n <= 2)
    end)
end)


describe("a stream that fails mid-way", function()
    local tl = require "tinyloop"

    if helpers.skip_without_model() then
        return
    end

    it("raises from the iterator (a for loop cannot see a second value)", function()
        local m = tl.Model(helpers.model_path)
        local it, st = m:stream({ 1, 2, 3 }, { max_tokens = 8 })
        assert.is_number(it(st))
        m:close()
        assert.has_error(function() it(st) end, "tinyloop.Model is closed; cannot call stream")
    end)
end)
