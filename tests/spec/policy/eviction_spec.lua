-- Eviction policies pushed into C as data: weights, linearized scores,
-- pool policies, reloads.
local policy = require "tinyloop.policy"

local function fake_model()
    local m = { pushed = {}, spills = {} }
    function m:set_evict_weights(w)
        self.pushed[#self.pushed + 1] = w
    end
    function m:set_spill_policy(sp)
        self.spills[#self.spills + 1] = sp
    end
    return m
end


local function fake_pool()
    local p = { policies = {} }
    function p:set_policy(x)
        self.policies[#self.policies + 1] = x
    end
    return p
end


describe("policy.eviction_weights()", function()
    it("passes a policy's weights through, missing ones as 0", function()
        local v = assert(policy.compile("return { kind = 'eviction', version = '1', weights = { hits = 2 } }", "e"))
        assert.same({ recency = 0, hits = 2, tokens = 0, depth = 0 }, policy.eviction_weights(v))
    end)

    it("linearizes a score-only policy", function()
        local v = assert(policy.compile([[return { kind = 'eviction', version = '1',
            score = function(n) return 2 * n.last_access + 3 * n.hits - n.n_tokens + 0.5 * n.start end }]], "e"))
        local w = policy.eviction_weights(v)
        assert.near(2, w.recency, 1e-9)
        assert.near(3, w.hits, 1e-9)
        assert.near(-1, w.tokens, 1e-9)
        assert.near(0.5, w.depth, 1e-9)
    end)
end)


describe("policy.eviction_runtime()", function()
    it("pushes each swapped-in version into the model and its pools", function()
        local m, p = fake_model(), fake_pool()
        local rt = policy.eviction_runtime(m, { kind = "eviction", pools = { p },
            source = "return { kind = 'eviction', version = 'a', weights = { recency = 1 }, pool_policy = 'lru' }" })
        assert.same({ { recency = 1, hits = 0, tokens = 0, depth = 0 } }, m.pushed)
        assert.same({ "lru" }, p.policies)
        assert.is_truthy(rt:set_source(
            "return { kind = 'eviction', version = 'b', weights = { tokens = 1 }, pool_policy = 'shortest' }"))
        assert.same({ recency = 0, hits = 0, tokens = 1, depth = 0 }, m.pushed[2])
        assert.same({ "lru", "shortest" }, p.policies)
    end)

    it("pushes nothing for a rejected version", function()
        local m = fake_model()
        local rt = policy.eviction_runtime(m, { source = "return { kind = 'eviction', version = 'a', weights = {} }" })
        assert.is_nil(rt:set_source("return { kind = 'eviction', version = 'b', score = function() return 'x' end }"))
        assert.equal(1, #m.pushed)
        assert.equal("a", rt.current.version)
    end)
end)


describe("an eviction policy's spill table", function()
    local function source(spill)
        return "return { kind = 'eviction', version = 'a', weights = { recency = 1 }, spill = " .. spill .. " }"
    end

    it("is pushed into C with set_spill_policy, missing fields as 0", function()
        local m = fake_model()
        policy.eviction_runtime(m, { source = source("{ min_tokens = 64, min_hits = 2 }") })
        assert.same({ { min_tokens = 64, min_hits = 2 } }, m.spills)
        m = fake_model()
        policy.eviction_runtime(m, { source = source("{ min_hits = 1 }") })
        assert.same({ { min_tokens = 0, min_hits = 1 } }, m.spills)
        m = fake_model()
        policy.eviction_runtime(m, { source = source("{}") })
        assert.same({ { min_tokens = 0, min_hits = 0 } }, m.spills)
    end)

    it("is reset to spill everything by a reload to a version without one", function()
        local m = fake_model()
        local rt = policy.eviction_runtime(m, { source = source("{ min_tokens = 64 }") })
        assert.is_truthy(rt:set_source("return { kind = 'eviction', version = 'b', weights = { hits = 1 } }"))
        assert.same({ { min_tokens = 64, min_hits = 0 }, { min_tokens = 0, min_hits = 0 } }, m.spills)
    end)

    it("rejects values that are not non-negative integers, and unknown fields, with a message", function()
        local cases = {
            { "{ min_tokens = -1 }", "spill.min_tokens must be a non-negative integer, got -1" },
            { "{ min_hits = 1.5 }", "spill.min_hits must be a non-negative integer, got 1.5" },
            { "{ min_tokens = 'x' }", "spill.min_tokens must be a non-negative integer, got x" },
            { "{ min_tokens = 1/0 }", "spill.min_tokens must be a non-negative integer, got inf" },
            { "{ min_tokens = 2^40 }", "spill.min_tokens must be a non-negative integer, got 1099511627776" },
            { "{ tier = 'disk' }", "spill.tier is not one of min_tokens, min_hits" },
            { "'drop'", "spill must be a table { min_tokens = N, min_hits = M }, got string" },
            { "7", "spill must be a table { min_tokens = N, min_hits = M }, got number" },
        }
        for _, c in ipairs(cases) do
            local v, err = policy.compile(source(c[1]), "e")
            assert.is_nil(v, c[1])
            assert.matches(c[2], err, 1, true)
        end
    end)

    it("leaves C untouched when a reload's spill is rejected", function()
        local m = fake_model()
        local rt = policy.eviction_runtime(m, { source = source("{ min_tokens = 8 }") })
        assert.is_nil(rt:set_source(source("{ min_tokens = -8 }")))
        assert.same({ { min_tokens = 8, min_hits = 0 } }, m.spills)
        assert.equal("a", rt.current.version)
    end)

    it("is what the default cost policy sets", function()
        local src = require("helpers").read(require("helpers").root .. "/lua/policies/eviction_cost.lua")
        local v = assert(policy.compile(src, "eviction_cost.lua", { kind = "eviction" }))
        assert.same({ min_tokens = 32, min_hits = 0 }, require("tinyloop.policy.apply").spill_policy(v))
    end)
end)
