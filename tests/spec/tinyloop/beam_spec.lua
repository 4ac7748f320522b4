-- Beam search through Model:generate({ beams = B, length_penalty = a }) on
-- stories260K: one beam is greedy decoding, beams compose with pools, and
-- misuse raises naming the option.
local helpers = require "helpers"

local range = helpers.range

describe("Model:generate() with beams", function()
    if helpers.skip_without_model() then
        return
    end
    local tl = require "tinyloop"
    local model
    local prompt = range(100, 140)

    before_each(function()
        model = tl.Model(helpers.model_path)
    end)

    after_each(function()
        model:close()
    end)

    it("returns greedy decoding's tokens with one beam", function()
        local greedy = model:generate(prompt, { max_tokens = 20, temperature = 0, no_cache = true })
        local got, info = model:generate(prompt, { max_tokens = 20, beams = 1, no_cache = true })
        assert.same(greedy, got)
        assert.are.equal(#greedy < 20 and "eos" or "length", info.finish_reason)
    end)

    it("reports a score that is the log-probability over the length to the power length_penalty", function()
        local got, info = model:generate(prompt, { max_tokens = 12, beams = 4, length_penalty = 1.0 })
        assert.is_true(#got >= 1 and #got <= 12)
        assert.is_true(info.logprob < 0)
        assert.are.near(info.logprob / info.n_generated, info.score, 1e-5)
        local _, raw = model:generate(prompt, { max_tokens = 12, beams = 4, length_penalty = 0 })
        assert.are.near(raw.logprob, raw.score, 1e-6)
    end)

    it("returns int32_t cdata, its length and the scores with as_cdata", function()
        local c, n, info = model:generate(prompt, { max_tokens = 6, beams = 3, as_cdata = true, ignore_eos = true })
        assert.are.equal(6, n)
        assert.are.equal("length", info.finish_reason)
        assert.are.equal("cdata", type(c))
    end)

    it("reuses a pooled prefix and returns the uncached search's tokens", function()
        local want = model:generate(prompt, { max_tokens = 10, beams = 4, no_cache = true })
        local pool = tl.PrefixPool(2)
        assert.are.equal(30, model:register_prefix(pool, range(100, 129)))
        local got, info = model:generate(prompt, { max_tokens = 10, beams = 4, pool = pool })
        assert.same(want, got)
        assert.are.equal(30, info.n_cached)
        assert.are.equal(1, pool:stats().hits)
    end)

    it("shares the prompt's KV between beams", function()
        local long = {}
        for i = 1, 100 do
            long[i] = 3 + (i * 37) % 500
        end
        local _, info = model:generate(long, { max_tokens = 4, beams = 8, ignore_eos = true })
        local per = model:info()
        local depth = per.n_layer
        local prompt_blocks = math.ceil(100 / per.kv_block_size) * depth
        assert.is_true(info.kv_blocks_peak <= prompt_blocks + 8 * depth,
            "peak " .. info.kv_blocks_peak .. " blocks, prompt " .. prompt_blocks)
    end)

    it("raises on beams outside [1, 1024] and on a length_penalty that is not a finite number", function()
        assert.has_error(function() model:generate(prompt, { beams = 0 }) end,
            "bad argument 'beams' to generate (expected an integer >= 1, got 0)")
        assert.has_error(function() model:generate(prompt, { beams = 2000 }) end,
            "bad argument 'beams' to generate (expected an integer in [1, 1024], got 2000)")
        assert.has_error(function() model:generate(prompt, { beams = 2, length_penalty = "x" }) end,
            "bad argument 'length_penalty' to generate (expected a number, got \"x\")")
        assert.has_error(function() model:generate(prompt, { beams = 2, length_penalty = math.huge }) end,
            "bad argument 'length_penalty' to generate (expected a finite number, got inf)")
        assert.has_error(function() model:generate(prompt, { beams = 2, beam = 3 }) end,
            "bad argument 'opts' to generate (unknown option \"beam\")")
        assert.has_error(function() model:generate(prompt, { beams = 2, pool = {} }) end,
            "bad argument 'pool' to generate (expected a tinyloop.PrefixPool, got table)")
    end)

    it("returns nil, err, code when the beams do not fit in the KV arena (a runtime failure)", function()
        local small = tl.Model(helpers.model_path, { kv_mem = 64 * 1024 })
        local got, err, code = small:generate(prompt, { max_tokens = 64, beams = 256, no_cache = true })
        small:close()
        assert.is_nil(got)
        assert.matches("^out of memory: ", err)
        assert.are.equal(tl.lib.C.TL_ERR_KV_FULL, code)
    end)
end)
