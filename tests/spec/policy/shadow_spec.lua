-- Shadow eviction: metadata-only radix trees fed by the request stream.
local helpers = require "helpers"
local policy = require "tinyloop.policy"
local shadow = require "tinyloop.policy.shadow"

local range = helpers.range


local function load_default(name)
    return assert(policy.compile(helpers.read(helpers.root .. "/lua/policies/" .. name .. ".lua"), name))
end


describe("shadow Sim", function()
    it("matches the longest cached prefix at token granularity, as the engine at most all but one", function()
        local s = shadow.new_sim { block_size = 4 }
        assert.equal(0, s:request(range(1, 10), {}))
        assert.equal(9, s:request(range(1, 10), {}))
        assert.equal(6, s:request(helpers.concat(range(1, 6), { 99, 98 }), {}))
        assert.equal(8, s:peek(helpers.concat(range(1, 6), { 99, 98, 5 })))
        local st = s:stats()
        assert.equal(3, st.lookups)
        assert.equal(2, st.hits)
        assert.equal(15, st.hit_tokens)
    end)

    it("inserts prompt and output but its last token, as the engine caches them", function()
        local s = shadow.new_sim { block_size = 4 }
        s:request(range(1, 8), { 50, 51 })
        assert.equal(9, s:request(helpers.concat(range(1, 8), { 50, 51, 60 }), {}))
        assert.equal(10, s:request(helpers.concat(range(1, 8), { 50, 51, 61 }), {}))
    end)

    it("keeps salted namespaces apart except shareable pinned entries", function()
        local s = shadow.new_sim { block_size = 4 }
        s:insert(range(1, 8), 0, { pinned = true, shareable = true })
        s:request(range(1, 16), {}, { salt = 7 })
        assert.equal(8, s:peek(range(1, 16), 9))
        assert.equal(16, s:peek(range(1, 16), 7))
        assert.equal(8, s:peek(range(1, 16), 0))
    end)

    it("evicts the lowest score first and never a pinned entry", function()
        local s = shadow.new_sim { block_size = 4, capacity_blocks = 6, policy = { recency = 1 } }
        s:insert(range(1, 8), 0, { pinned = true })           -- 2 blocks
        s:request(range(101, 108), {})                        -- 2 blocks, older
        s:request(range(201, 208), {})                        -- 2 blocks: full
        s:request(range(301, 308), {})                        -- evicts 101..108
        assert.equal(0, s:peek(range(101, 108)))
        assert.equal(8, s:peek(range(201, 208)))
        assert.equal(8, s:peek(range(1, 8)))
        assert.equal(6, s.used)
        assert.equal(1, s:stats().evictions)
    end)

    it("uses a policy version's weights, or its score with mode = score", function()
        local lru = load_default("eviction_lru")
        local short = load_default("eviction_shortest")
        local function run(p, mode)
            local s = shadow.new_sim { block_size = 4, capacity_blocks = 4, policy = p, mode = mode }
            s:request(range(1, 8), {})           -- long, older
            s:request(range(101, 104), {})       -- short, newer
            s:request(range(201, 204), {})
            s:request(range(301, 304), {})       -- over: one must go
            return s
        end
        assert.equal(0, run(lru):peek(range(1, 8)))
        assert.equal(8, run(short):peek(range(1, 8)))
        assert.equal(0, run(lru, "score"):peek(range(1, 8)))
        local cost = run(load_default("eviction_cost"), "score")
        assert.equal(0, cost:stats().failed_scores)
    end)
end)


describe("Shadow", function()
    it("reports each candidate's hit rate beside the live one", function()
        local sh = shadow.new { capacity_blocks = 8, block_size = 4,
            policies = { lru = load_default("eviction_lru"), shortest = load_default("eviction_shortest") } }
        for i = 1, 20 do
            local p = range(1 + (i % 3) * 100, 12 + (i % 3) * 100)
            sh:feed(p, {}, { cached = i > 3 and 12 or 0 })
        end
        local r = sh:report()
        assert.equal(20, r.live.lookups)
        assert.near(17 * 12 / 240, r.live.hit_rate, 1e-9)
        assert.is_number(r.lru.hit_rate)
        assert.is_number(r.shortest.hit_rate)
        assert.matches("live", sh:format())
    end)
end)
