-- The default routing policy and the runtime's route().
local helpers = require "helpers"
local policy = require "tinyloop.policy"
local shadow = require "tinyloop.policy.shadow"

local range = helpers.range

local v = assert(policy.compile(helpers.read(helpers.root .. "/lua/policies/routing.lua"), "routing"))


describe("lua/policies/routing.lua", function()
    it("routes to the candidate holding the longest cached match when load is even", function()
        local a = { id = "a", load = 2 }
        local b = { id = "b", load = 1 }
        local s = shadow.new_sim {}
        s:request(range(1, 100), {})
        a.shadow = s
        assert.equal(a, (policy.route(v, { tokens = range(1, 120) }, { a, b })))
    end)

    it("routes to a candidate holding a registered prefix of the prompt", function()
        local a = { id = "a", load = 0 }
        local b = { id = "b", load = 0, prefixes = { range(1, 80) } }
        assert.equal(b, (policy.route(v, { tokens = range(1, 100) }, { a, b })))
    end)

    it("falls back to the least loaded when the match is below the cache threshold", function()
        local a = { id = "a", load = 5, prefixes = { range(1, 10) } }
        local b = { id = "b", load = 1 }
        assert.equal(b, (policy.route(v, { tokens = range(1, 100) }, { a, b })))
    end)

    it("balances when load is uneven even if one candidate has the cache", function()
        local a = { id = "a", load = 200, prefixes = { range(1, 100) } }
        local b = { id = "b", load = 2 }
        assert.equal(b, (policy.route(v, { tokens = range(1, 100) }, { a, b })))
    end)

    it("sends one tenant's cold requests to the same candidate", function()
        local cands = { { id = "a" }, { id = "b" }, { id = "c" } }
        local first = policy.route(v, { tokens = { 1 }, tenant = "acme" }, cands)
        for _ = 1, 5 do
            assert.equal(first, (policy.route(v, { tokens = { 1 }, tenant = "acme" }, cands)))
        end
    end)
end)


describe("policy.route()", function()
    it("falls back to the least loaded when the policy fails", function()
        local bad = assert(policy.compile([[
            return { kind = "routing", version = "x", choose = function(r, c)
                if r.tenant == "boom" then error("boom") end
                return c[1]
            end }]], "x"))
        local before = policy.route_fallbacks()
        local a, b = { id = "a", load = 3 }, { id = "b", load = 1 }
        assert.equal(b, (policy.route(bad, { tenant = "boom", tokens = {} }, { a, b })))
        assert.equal(before + 1, policy.route_fallbacks())
        assert.equal(a, (policy.route(bad, { tokens = {} }, { a, b })))
    end)
end)
