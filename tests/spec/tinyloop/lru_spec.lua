-- tinyloop.lru: the bounded map behind the server's tenant ids and pinned
-- system-prompt pools (issue 15, item 14).
describe("tinyloop.lru", function()
    local lru = require "tinyloop.lru"

    describe(".new()", function()
        it("refuses a capacity that is not an integer >= 1", function()
            assert.has_error(function() lru.new(0) end, "lru.new: cap must be an integer >= 1, got 0")
            assert.has_error(function() lru.new(1.5) end, "lru.new: cap must be an integer >= 1, got 1.5")
            assert.has_error(function() lru.new("8") end, "lru.new: cap must be an integer >= 1, got 8")
        end)
    end)

    describe(":set()", function()
        it("never holds more than its capacity", function()
            local t = lru.new(3)
            for i = 1, 100 do
                t:set(i, i)
                assert.is_true(t:count() <= 3)
            end
            assert.are.equal(3, t:count())
            assert.same({ 98, 99, 100 }, { t:peek(98), t:peek(99), t:peek(100) })
            assert.is_nil(t:peek(97))
        end)

        it("drops the least recently used entry and hands it to on_evict", function()
            local gone = {}
            local t = lru.new(2, function(k, v) gone[#gone + 1] = k .. "=" .. v end)
            t:set("a", 1)
            t:set("b", 2)
            t:get("a") -- a is now the most recent
            t:set("c", 3)
            assert.same({ "b=2" }, gone)
            assert.are.equal(1, t:get("a"))
            assert.is_nil(t:get("b"))
        end)

        it("overwrites an existing key without evicting", function()
            local n = 0
            local t = lru.new(2, function() n = n + 1 end)
            t:set("a", 1)
            t:set("b", 2)
            t:set("a", 10)
            assert.are.equal(0, n)
            assert.are.equal(2, t:count())
            assert.are.equal(10, t:get("a"))
        end)
    end)

    describe(":peek() and :delete()", function()
        it("peek does not touch; delete removes without on_evict", function()
            local gone = {}
            local t = lru.new(2, function(k) gone[#gone + 1] = k end)
            t:set("a", 1)
            t:set("b", 2)
            assert.are.equal(1, t:peek("a")) -- a stays the least recent
            t:set("c", 3)
            assert.same({ "a" }, gone)
            t:delete("b")
            assert.are.equal(1, t:count())
            assert.same({ "a" }, gone)
            t:delete("nope")
            assert.are.equal(1, t:count())
        end)
    end)
end)
